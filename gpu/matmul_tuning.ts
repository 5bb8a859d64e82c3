/**
 * Picks matmul tilings per adapter by measuring the kernels themselves. What
 * is fastest differs by adapter (CPU adapters favour large per-thread
 * register blocks, GPUs shared-memory tiles), by dtype, by orientation (a
 * linear layer runs x·Wᵀ forward, g·W and gᵀ·x backward) and by size, so
 * the tuner keeps one winner per matmul class: (storage dtype, orientation,
 * size). Each candidate runs a representative problem of the class after a
 * warm-up, timed with GPU timestamps where the adapter has them (else wall
 * time over enough repeats that the ~11 ms wait does not dominate). Winners
 * are cached per adapter and tuner version in `localStorage` when the runtime
 * offers it; dispatch picks the winner of the class at hand.
 */
import type { Gpu, MatmulTiling } from "./device.ts";
import { dispatchMatmul, type MatmulProblem } from "./kernels/matmul.ts";
import { type MatmulClass, matmulClassKey, type MatmulSize } from "./matmul_class.ts";
import { Tensor } from "./tensor.ts";
import { untracked } from "./scope.ts";
import {
  type CandidateTimer,
  progressReporter,
  secondsPerRun,
  timeCandidates,
  tunerCacheKey,
  type TuningProgress,
  winnerCache,
} from "./kernel_timing.ts";
import { tilingFits, tilingKind } from "./kernels/tilings.ts";

/** The tilings CPU adapters try, register blocks first. */
const CPU_CANDIDATES: readonly MatmulTiling[] = [
  { variant: "register", tm: 4, tn: 4, wgx: 8, wgy: 8, tk: 1 },
  { variant: "register", tm: 8, tn: 8, wgx: 8, wgy: 4, tk: 1 },
  { variant: "register", tm: 8, tn: 16, wgx: 4, wgy: 4, tk: 1 },
  { variant: "register", tm: 16, tn: 16, wgx: 2, wgy: 4, tk: 1 },
  { variant: "interleaved", tm: 4, tn: 4, wgx: 8, wgy: 8, tk: 1 },
  { variant: "interleaved", tm: 8, tn: 8, wgx: 8, wgy: 4, tk: 1 },
  { variant: "interleaved", tm: 8, tn: 4, wgx: 8, wgy: 8, tk: 1 },
  { variant: "interleaved", tm: 16, tn: 4, wgx: 8, wgy: 2, tk: 1 },
  { variant: "shared", tm: 4, tn: 4, wgx: 16, wgy: 16, tk: 16 },
  { variant: "shared", tm: 8, tn: 8, wgx: 8, wgy: 8, tk: 8 },
];

/**
 * Tilings tried on GPUs only. The vec4 ones are the H100 SGEMM probe's
 * fastest (`shared/perf/h100-fast-matmul-2026-11-23.jsonl`, 4096³ f32):
 * 128×128×32 with 8×8 per thread (42.5 A·B, 40.3 A·Bᵀ, 46.6 Aᵀ·B TFLOP/s),
 * 128×256×16 and 128×256×8 with 8×16 (44.2 / 44.6 A·B, 43.1 A·Bᵀ, 46.7
 * Aᵀ·B); 128×192×16 with 8×12, unmeasured, covers n = 384 (the GPT's
 * qkv, projection and fc2 outputs) in two tiles instead of a half-empty
 * third 128×256; 64×64×16 with 4×4 keeps small products from leaving most
 * of a tile empty. One blocked tiling stays as the control (and for
 * convolutions, which get the blocked kernel of a vec4 tiling's shape).
 */
const GPU_CANDIDATES: readonly MatmulTiling[] = [
  { variant: "vec4", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 32 },
  { variant: "vec4", tm: 8, tn: 16, wgx: 16, wgy: 16, tk: 16 },
  { variant: "vec4", tm: 8, tn: 16, wgx: 16, wgy: 16, tk: 8 },
  { variant: "vec4", tm: 8, tn: 12, wgx: 16, wgy: 16, tk: 16 },
  { variant: "vec4", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 16 },
  { variant: "vec4", tm: 4, tn: 4, wgx: 16, wgy: 16, tk: 16 },
  { variant: "blocked", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 16 },
];

/** Every tiling the tuner knows: CPU adapters try the first ten, GPUs all. */
export const MATMUL_CANDIDATES: readonly MatmulTiling[] = [...CPU_CANDIDATES, ...GPU_CANDIDATES];

/**
 * The candidates tried on `gpu` for operands stored in `dtype`: on CPU
 * adapters the register, interleaved and shared tilings; on GPUs every one
 * whose workgroup fits the device's limits.
 */
export function matmulCandidates(gpu: Gpu, dtype: "f32" | "f16"): readonly MatmulTiling[] {
  if (gpu.adapterProfile.cpu) return MATMUL_CANDIDATES.filter((t) => !tilingKind(t).forGpus);
  return MATMUL_CANDIDATES.filter((t) => tilingFits(t, dtype, gpu.adapterProfile.limits));
}

/** The tiling used before (or instead of) a search. */
export const DEFAULT_TILING: MatmulTiling = MATMUL_CANDIDATES[0];

/** Bump when kernels or candidates change: cached winners of older versions are ignored. */
const TUNER_VERSION = 5;

/** One candidate's measured speed on a class's problem. */
export interface TilingMeasurement {
  /** The candidate. */
  tiling: MatmulTiling;
  /** Seconds per product (the better of its timings). */
  seconds: number;
  /** Its speed, in GFLOP/s: the product's 2·m·n·k FLOPs over `seconds`. */
  gflops: number;
}

/** A class's result: the winner and every measurement (none when the winner came from the cache). */
export interface ClassTuning {
  /** The class. */
  class: MatmulClass;
  /** The fastest candidate. */
  best: MatmulTiling;
  /** Every candidate's speed (empty when cached). */
  measurements: TilingMeasurement[];
  /** True when the winner was read from the per-adapter cache. */
  cached: boolean;
}

/** Options of {@link tuneMatmul}. */
export interface TuneMatmulOptions {
  /** Classes to tune (default: {@link defaultTuningClasses} for the adapter). */
  classes?: readonly MatmulClass[];
  /** Measure again even when the cache has a winner (default false). */
  force?: boolean;
  /**
   * Times a candidate's run (default: GPU timestamps, else wall time; see
   * `secondsPerRun`). Given one, the cache is neither read nor written: its
   * figures need not be this adapter's (tests inject one to check the pick).
   */
  timer?: CandidateTimer<MatmulTiling>;
  /** Told before the first class the cache lacks is measured and after each. */
  onProgress?: (progress: TuningProgress) => void;
}

/**
 * The classes `initGpu` tunes: every orientation of each dtype the device
 * has, at medium size, and on GPUs small and large too (on CPU adapters a
 * large problem takes seconds per candidate, and their winners agree with
 * the medium ones).
 */
export function defaultTuningClasses(gpu: Gpu): MatmulClass[] {
  const sizes: MatmulSize[] = gpu.adapterProfile.cpu ? ["medium"] : ["small", "medium", "large"];
  const dtypes: ("f32" | "f16")[] = gpu.f16 ? ["f32", "f16"] : ["f32"];
  const out: MatmulClass[] = [];
  for (const dtype of dtypes) {
    for (const orientation of ["nn", "nt", "tn"] as const) {
      for (const size of sizes) out.push({ dtype, orientation, size });
    }
  }
  return out;
}

/** A problem in the middle of each size class ([m, n, k]). */
const REPRESENTATIVE: Record<MatmulSize, [number, number, number]> = {
  small: [64, 128, 256], // 2^21 multiply-adds
  medium: [256, 512, 256], // 2^25
  large: [2048, 2048, 1024], // 2^32
};

function cacheOf(gpu: Gpu) {
  return winnerCache(
    tunerCacheKey(gpu, "matmulTuning", TUNER_VERSION),
    (stored) => MATMUL_CANDIDATES.find((c) => JSON.stringify(c) === JSON.stringify(stored)),
  );
}

/** The problem of `c` with its operands laid out for the orientation. */
function problemOf(c: MatmulClass): MatmulProblem {
  const [m, n, k] = REPRESENTATIVE[c.size];
  const transA = c.orientation === "tn", transB = c.orientation === "nt";
  return {
    batch: 1,
    m,
    n,
    k,
    a: { batch: 0, row: transA ? 1 : k, col: transA ? m : 1 },
    b: { batch: 0, row: transB ? 1 : n, col: transB ? k : 1 },
  };
}

/** Measures every candidate on `c`'s problem with `timer` and returns the winner. */
async function tuneClass(
  gpu: Gpu,
  c: MatmulClass,
  timer: CandidateTimer<MatmulTiling>,
): Promise<ClassTuning> {
  const problem = problemOf(c);
  const { m, n, k } = problem;
  const dtype = c.dtype;
  const operands = untracked(() => ({
    a: Tensor.full([m * k], 0.5, { dtype, gpu }),
    b: Tensor.full([k * n], 0.25, { dtype, gpu }),
    c: Tensor.empty([m * n], dtype, gpu),
  }));
  const candidates = matmulCandidates(gpu, dtype);
  let timed: { best: MatmulTiling; seconds: number[] };
  try {
    timed = await timeCandidates(candidates, (tiling) =>
      timer(
        tiling,
        () => dispatchMatmul(problem, operands.a, operands.b, operands.c, {}, tiling),
      ));
  } finally {
    for (const t of Object.values(operands)) t.dispose();
  }
  const flops = 2 * m * n * k;
  const measurements = candidates.map((tiling, i) => ({
    tiling,
    seconds: timed.seconds[i],
    gflops: flops / Math.max(timed.seconds[i], 1e-12) / 1e9,
  }));
  const best = timed.best;
  return { class: c, best, measurements, cached: false };
}

/**
 * Tunes the matmul classes `options.classes` (default: those `initGpu` tunes)
 * on `gpu`, records each winner in `gpu.matmulTilings` (which dispatch reads)
 * and caches them per adapter. A class with a cached winner is not measured
 * again unless `force` is set. Waits for the GPU many times: call it at
 * start-up, never per step.
 *
 * @example
 * ```ts
 * import { initGpu, tuneMatmul } from "./mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const [result] = await tuneMatmul(gpu, {
 *   classes: [{ dtype: "f32", orientation: "nt", size: "small" }],
 * });
 * console.assert(gpu.matmulTilings.get("f32/nt/small") === result.best);
 * gpu.destroy();
 * ```
 */
export async function tuneMatmul(
  gpu: Gpu,
  options: TuneMatmulOptions = {},
): Promise<ClassTuning[]> {
  const cache = cacheOf(gpu);
  const timer = options.timer ?? ((_, run) => secondsPerRun(gpu, run));
  const cached = options.force || options.timer ? {} : cache.read();
  const results: ClassTuning[] = [];
  const classes = options.classes ?? defaultTuningClasses(gpu);
  const missing = classes.filter((c) => !cached[matmulClassKey(c)]).length;
  const measured = progressReporter("matmul tilings", missing, options.onProgress);
  for (const c of classes) {
    const key = matmulClassKey(c);
    const hit = cached[key];
    const result = hit
      ? { class: c, best: hit, measurements: [], cached: true }
      : await tuneClass(gpu, c, timer);
    if (!hit) measured();
    gpu.matmulTilings.set(key, result.best);
    results.push(result);
  }
  if (!options.timer) cache.write(gpu.matmulTilings);
  return results;
}
