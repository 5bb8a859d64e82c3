/**
 * The tiled GEMM code generator shared by matmul and the implicit-GEMM
 * convolutions: C[row, col] = Σ_k A[row, k]·B[k, col] with f32 accumulation,
 * then bias and activation. How A and B are read and C is written comes from
 * a {@link GemmIo}: strided loads for matmul, gathers with padding for a
 * convolution (so no im2col buffer is ever written).
 *
 * The tilings, chosen per adapter (see `class_tuner.ts`), are records of
 * `tilings.ts`:
 * - `register` / `interleaved` / `shared` (`gemm_register.ts`): CPU adapters;
 * - `blocked` (`gemm_blocked.ts`): large workgroup tiles read as vec4, for
 *   GPUs, with any operand addressing (the convolutions' gathers);
 * - `vec4` (`gemm_vec4.ts`): the H100 probe's structure (vec4 global loads,
 *   register prefetch), for matmul on GPUs.
 *
 * The generated kernel reads `p.m` and `p.n` from its uniforms, sums over
 * `io.kCount` (default `p.k`) and calls the third dispatch dimension `z` (a
 * batch, a convolution group, or a slice of a split reduction).
 */
import type { Gpu } from "../../device/gpu.ts";
import { failLoopIterations } from "../loop_limit.ts";
import type { Activation } from "../wgsl/math.ts";
import type { GemmIo } from "./gemm_io.ts";
import { tilingKind } from "./tilings.ts";
import { matmulSettings, type MatmulTiling } from "./settings.ts";

export { type GemmIo, transposedIo } from "./gemm_io.ts";

/** The WGSL body (after the bindings header) of a GEMM kernel with tiling `t`. */
export function gemmWgsl(t: MatmulTiling, io: GemmIo, activation: Activation = "none"): string {
  return tilingKind(t).wgsl(t, io, activation);
}

/** Workgroups to cover an m × n result with tiling `t`, `depth` deep. */
export function gemmGrid(
  t: MatmulTiling,
  m: number,
  n: number,
  depth: number,
): [number, number, number] {
  return [Math.ceil(n / (t.tn * t.wgx)), Math.ceil(m / (t.tm * t.wgy)), depth];
}

/** Loop iterations one invocation runs for a reduction over `k`. */
function gemmLoopIterations(k: number, tiling: MatmulTiling): number {
  return tilingKind(tiling).loopIterations(tiling, k);
}

/**
 * Throws a clear error where a product's reduction over `k` would pass the
 * adapter's loop cap (see loop_limit.ts). `op` names the caller.
 */
export function checkGemmLoops(gpu: Gpu, k: number, tiling: MatmulTiling, op: string): void {
  const iterations = gemmLoopIterations(k, tiling);
  if (iterations <= gpu.loopIterationLimit) return;
  failLoopIterations(
    gpu,
    iterations,
    op,
    `a reduction over K = ${k}`,
    "Use a smaller batch (a weight gradient's K is its rows) or a GPU adapter.",
  );
}

/** Split-K slices sum at least this many k each... */
const MIN_SLICE_K = 256;
/** ...and there are at most this many, unless the loop cap needs more. */
const MAX_SLICES = 64;

/**
 * How many slices a GEMM's reduction over `k` is split into (split-K): each
 * slice's workgroups sum their stretch of k into f32 partial results, which
 * a reduction adds up afterwards in a fixed order. A result of few tiles
 * reduced over a long k (a weight gradient: a few hundred by a few hundred,
 * summed over every token) would otherwise keep a handful of a GPU's
 * multiprocessors busy (a GPT's fc1 gᵀ·x makes a few dozen 128×128 tiles
 * where a large GPU runs over a hundred workgroups at once). Slices are added until about
 * `matmulSettings.of(gpu).splitKWorkgroups` workgroups run, each slice at least 256 long and
 * at most 64 of them; on lavapipe always enough that no slice passes the
 * loop cap. `tiles` is the workgroup count without splitting.
 */
export function gemmSlices(gpu: Gpu, tiling: MatmulTiling, tiles: number, k: number): number {
  const target = matmulSettings.of(gpu).splitKWorkgroups;
  const wanted = target > 0
    ? Math.min(Math.ceil(target / tiles), Math.floor(k / MIN_SLICE_K), MAX_SLICES)
    : 1;
  const needed = Math.ceil(gemmLoopIterations(k, tiling) / gpu.loopIterationLimit);
  return Math.max(1, wanted, needed);
}

/** The most slices a reduction over `k` is split into (each sums at least 256, at most 64 of them). */
export function maxSlices(k: number): number {
  return Math.min(Math.floor(k / MIN_SLICE_K), MAX_SLICES);
}

/**
 * The split-K slice counts worth timing for an m × n result, `depth` deep,
 * reduced over k with `tiling` on `gpu` (the per-shape tuner's candidates):
 * counts that make tiles × slices fill whole waves of the adapter's
 * multiprocessors (`adapterProfile.multiprocessors`), at most `count` of
 * them, fullest last wave first. None where the unsplit grid already fills
 * a wave or k is too short to split (each slice sums at least 256).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../../mod.ts";
 * import { gpuLikeProfile, withAdapterProfile } from "../../tuning/profile_switch.ts";
 * import { waveSlices } from "./gemm.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const tiling = { variant: "vec4", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 32 } as const;
 * // The GPT's fc1 weight gradient: 12 × 3 tiles of 128 × 128 over 16384 tokens.
 * const slices = await withAdapterProfile(gpu, gpuLikeProfile(gpu), () =>
 *   Promise.resolve(waveSlices(gpu, tiling, { m: 1536, n: 384, k: 16384 }, 1)));
 * assert.equal(slices[0], 11); // 36 × 11 = 396 = 3 waves of 132
 * gpu.destroy();
 * ```
 */
export function waveSlices(
  gpu: Gpu,
  tiling: MatmulTiling,
  size: { m: number; n: number; k: number },
  depth: number,
  count = 2,
): number[] {
  const [gx, gy] = gemmGrid(tiling, size.m, size.n, depth);
  const tiles = gx * gy * depth, wave = gpu.adapterProfile.multiprocessors;
  const most = maxSlices(size.k);
  if (tiles >= wave || most < 2) return [];
  // How full the last wave is when `slices` run (1: every multiprocessor busy to the end).
  const fill = (slices: number) => {
    const groups = tiles * slices;
    return groups / (Math.ceil(groups / wave) * wave);
  };
  const options = new Set<number>();
  for (let waves = 1; waves <= 4; waves++) {
    for (const s of [Math.floor(waves * wave / tiles), Math.ceil(waves * wave / tiles)]) {
      // The count a slice length rounded to the K step really gives.
      const real = sliceLength(size.k, Math.min(s, most), tiling).slices;
      if (real >= 2) options.add(real);
    }
  }
  return [...options].sort((a, b) => fill(b) - fill(a) || a - b).slice(0, count);
}

/**
 * How an m × n result, `depth` deep, reduced over k is split with `tiling`
 * ({@link gemmSlices}): the length of a slice and their count (1: not split).
 */
export function gemmSplit(
  gpu: Gpu,
  tiling: MatmulTiling,
  size: { m: number; n: number; k: number },
  depth: number,
): { length: number; slices: number } {
  const [gx, gy] = gemmGrid(tiling, size.m, size.n, depth);
  return sliceLength(size.k, gemmSlices(gpu, tiling, gx * gy * depth, size.k), tiling);
}

/**
 * The length of each slice when a reduction over `k` is split into `slices`
 * (the last may be shorter), a multiple of the tiling's K step, and the
 * number of slices that length gives.
 */
export function sliceLength(
  k: number,
  slices: number,
  tiling: MatmulTiling,
): { length: number; slices: number } {
  if (slices <= 1) return { length: k, slices: 1 };
  const length = Math.ceil(k / slices / tiling.tk) * tiling.tk;
  return { length, slices: Math.ceil(k / length) };
}
