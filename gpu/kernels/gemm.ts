/**
 * The tiled GEMM code generator shared by matmul and the implicit-GEMM
 * convolutions: C[row, col] = Σ_k A[row, k]·B[k, col] with f32 accumulation,
 * then bias and activation. How A and B are read and C is written comes from
 * a {@link GemmIo}: strided loads for matmul, gathers with padding for a
 * convolution (so no im2col buffer is ever written).
 *
 * Three tilings, chosen per adapter (see `matmul_tuning.ts`):
 * - `register` / `interleaved`: every thread keeps a TM×TN block of C in
 *   registers and reads A and B straight from storage. Wins on CPU adapters.
 * - `shared`: the workgroup stages (TM·WGY)×TK and TK×(TN·WGX) tiles in
 *   workgroup memory, scalar reads.
 * - `blocked` (`gemm_blocked.ts`): large shared tiles read as vec4, written
 *   for real GPUs.
 *
 * The generated kernel reads `p.m` and `p.n` from its uniforms, sums over
 * `io.kCount` (default `p.k`) and calls the third dispatch dimension `z` (a
 * batch, a convolution group, or a slice of a split reduction).
 */
import type { Gpu, MatmulTiling } from "../device.ts";
import { failLoopIterations } from "./loop_limit.ts";
import { type Activation, WGSL_MATH } from "./wgsl_math.ts";
import { epilogue, type GemmIo, range, workgroupTileMain } from "./gemm_io.ts";
import { blockedWgsl } from "./gemm_blocked.ts";

export { type GemmIo, transposedIo } from "./gemm_io.ts";

function fmaBlock(t: MatmulTiling): string {
  const lines: string[] = [];
  for (let i = 0; i < t.tm; i++) {
    for (let j = 0; j < t.tn; j++) {
      lines.push(`acc[${i * t.tn + j}] = fma(a${i}, b${j}, acc[${i * t.tn + j}]);`);
    }
  }
  return lines.join("\n    ");
}

function registerWgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string {
  const { tm, tn, wgx, wgy } = t;
  // "register": a thread owns a contiguous TM×TN block. "interleaved": its rows
  // and columns are strided by the workgroup extent, so neighbouring threads
  // (SIMD lanes on a CPU adapter) read neighbouring addresses.
  const interleaved = t.variant === "interleaved";
  const row = (i: number) => interleaved ? `row0 + ${i * wgy}u` : `row0 + ${i}u`;
  const col = (j: number) => interleaved ? `col0 + ${j * wgx}u` : `col0 + ${j}u`;
  const firstRow = interleaved ? `wid.y * ${tm * wgy}u + lid.y` : `gid.y * ${tm}u`;
  const firstCol = interleaved ? `wid.x * ${tn * wgx}u + lid.x` : `gid.x * ${tn}u`;
  // Edge threads clamp their rows and columns into range and skip
  // out-of-range stores, so the inner loop has no branches.
  const rows = range(tm).map((i) => io.aRow(i, `min(${row(i)}, p.m - 1u)`));
  const cols = range(tn).map((j) => io.bCol(j, `min(${col(j)}, p.n - 1u)`));
  const aLoads = range(tm).map((i) => `let a${i} = ${io.aLoad(i)};`);
  const bLoads = range(tn).map((j) => `let b${j} = ${io.bLoad(j)};`);
  return `${WGSL_MATH}${io.prelude ?? ""}
@compute @workgroup_size(${wgx}, ${wgy})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let row0 = ${firstRow};
  let col0 = ${firstCol};
  if (row0 >= p.m || col0 >= p.n) { return; }
  let z = gid.z;
  ${io.setup}
  ${rows.join("\n  ")}
  ${cols.join("\n  ")}
  var acc: array<f32, ${tm * tn}>;
  for (var k = 0u; k < ${io.kCount ?? "p.k"}; k++) {
    ${io.kStep ?? ""}
    ${aLoads.join("\n    ")}
    ${bLoads.join("\n    ")}
    ${fmaBlock(t)}
  }
  ${epilogue(t, io, activation, row, col)}
}`;
}

function sharedWgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string {
  const { tm, tn, tk, wgx, wgy } = t;
  const bm = tm * wgy, bn = tn * wgx, threads = wgx * wgy;
  // Each thread's rows and columns are strided by the workgroup extent so
  // neighbouring threads read neighbouring shared-memory words.
  const aReads = range(tm).map((i) => `let a${i} = tile_a[kk * ${bm}u + lid.y + ${i * wgy}u];`);
  const bReads = range(tn).map((j) => `let b${j} = tile_b[kk * ${bn}u + lid.x + ${j * wgx}u];`);
  const kCount = io.kCount ?? "p.k";
  return `${WGSL_MATH}${io.prelude ?? ""}
var<workgroup> tile_a: array<f32, ${bm * tk}>; // [tk][bm]
var<workgroup> tile_b: array<f32, ${tk * bn}>; // [tk][bn]
${workgroupTileMain(t, io)}
  var acc: array<f32, ${tm * tn}>;
  for (var k0 = 0u; k0 < ${kCount}; k0 += ${tk}u) {
    for (var e = t; e < ${bm * tk}u; e += ${threads}u) {
      let r = e % ${bm}u; let kk = e / ${bm}u;
      let row = tile_row + r; let k = k0 + kk;
      var v = 0.0;
      if (row < p.m && k < ${kCount}) { v = ${io.aAt("row", "k")}; }
      tile_a[kk * ${bm}u + r] = v;
    }
    for (var e = t; e < ${tk * bn}u; e += ${threads}u) {
      let col_in = e % ${bn}u; let kk = e / ${bn}u;
      let col = tile_col + col_in; let k = k0 + kk;
      var v = 0.0;
      if (col < p.n && k < ${kCount}) { v = ${io.bAt("k", "col")}; }
      tile_b[kk * ${bn}u + col_in] = v;
    }
    workgroupBarrier();
    for (var kk = 0u; kk < ${tk}u; kk++) {
      ${aReads.join("\n      ")}
      ${bReads.join("\n      ")}
      ${fmaBlock(t)}
    }
    workgroupBarrier();
  }
  ${
    epilogue(
      t,
      io,
      activation,
      (i) => `tile_row + lid.y + ${i * wgy}u`,
      (j) => `tile_col + lid.x + ${j * wgx}u`,
    )
  }
}`;
}

/** The WGSL body (after the bindings header) of a GEMM kernel with tiling `t`. */
export function gemmWgsl(t: MatmulTiling, io: GemmIo, activation: Activation = "none"): string {
  if (t.variant === "blocked") return blockedWgsl(t, io, activation);
  return t.variant === "shared" ? sharedWgsl(t, io, activation) : registerWgsl(t, io, activation);
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

/** Loop iterations one invocation runs for a reduction over `k`: the tile loads of the shared tiling loop too, the blocked one's are unrolled. */
function gemmLoopIterations(k: number, tiling: MatmulTiling): number {
  if (tiling.variant === "shared") return 2 * k;
  return tiling.variant === "blocked" ? Math.ceil(k / tiling.tk) : k;
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
 * multiprocessors busy: the GPT's fc1 gᵀ·x is 36 workgroups of 128×128
 * against an H100's 132 multiprocessors. Slices are added until about
 * `gpu.splitKWorkgroups` workgroups run, each slice at least 256 long and
 * at most 64 of them; on lavapipe always enough that no slice passes the
 * loop cap. `tiles` is the workgroup count without splitting.
 */
export function gemmSlices(gpu: Gpu, tiling: MatmulTiling, tiles: number, k: number): number {
  const wanted = gpu.splitKWorkgroups > 0
    ? Math.min(Math.ceil(gpu.splitKWorkgroups / tiles), Math.floor(k / MIN_SLICE_K), MAX_SLICES)
    : 1;
  const needed = Math.ceil(gemmLoopIterations(k, tiling) / gpu.loopIterationLimit);
  return Math.max(1, wanted, needed);
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
