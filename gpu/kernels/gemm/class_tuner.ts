/**
 * Picks matmul tilings per adapter by measuring the kernels themselves. What
 * is fastest differs by adapter (CPU adapters favour large per-thread
 * register blocks, GPUs shared-memory tiles), by dtype, by orientation (a
 * linear layer runs x·Wᵀ forward, g·W and gᵀ·x backward) and by size, so
 * the tuner keeps one winner per matmul class: (storage dtype, orientation,
 * size). Each candidate runs a representative problem of the class after a
 * warm-up, timed with GPU timestamps where the adapter has them (else wall
 * time over enough repeats that the wait for the GPU does not dominate). Winners
 * are cached per adapter and tuner version in the per-user store; dispatch
 * picks the winner of the class at hand.
 */
import type { Gpu } from "../../device/gpu.ts";
import type { FloatDType } from "../../base/dtype.ts";
import { launchMatmulInto, type MatmulProblem } from "./matmul.ts";
import {
  denseProblem,
  MATMUL_CLASS_TASK,
  type MatmulClass,
  matmulClassKey,
  type MatmulSize,
  tunedSizes,
} from "./matmul_class.ts";
import { DeviceArray } from "../../device/device_array.ts";
import { type CandidateTimer, timeCandidates } from "../../tuning/timing.ts";
import { type PickStore, readPicks } from "../../tuning/cache.ts";
import { type ClassTuningOptions, tuneClasses } from "../../tuning/picks.ts";
import { MATMUL_CANDIDATES, matmulCandidates } from "./candidates.ts";
import { tilingKind } from "./tilings.ts";
import { DEFAULT_TILING, matmulSettings, type MatmulTiling } from "./settings.ts";

export { DEFAULT_TILING, MATMUL_CANDIDATES, matmulCandidates };

/** Bump when kernels or candidates change: cached winners of older versions are ignored. */
const TUNER_VERSION = 6;

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
export interface TuneMatmulOptions extends ClassTuningOptions<MatmulTiling> {
  /** Classes to tune (default: {@link defaultTuningClasses} for the adapter). */
  classes?: readonly MatmulClass[];
}

/**
 * The classes `initGpu({ tuning: "eager" })` tunes: every orientation of
 * each dtype the device has, at each size tuned on the adapter
 * (`tunedSizes`: medium on CPU adapters, all three on GPUs).
 */
export function defaultTuningClasses(gpu: Gpu): MatmulClass[] {
  const sizes: MatmulSize[] = tunedSizes(gpu);
  // bf16 needs no shader-f16: every adapter tunes it.
  const dtypes: FloatDType[] = gpu.f16 ? ["f32", "f16", "bf16"] : ["f32", "bf16"];
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

/** A class's winner as the cache keeps it. */
interface ClassRecord {
  /** The class. */
  shape: MatmulClass;
  /** Its winner. */
  pick: MatmulTiling;
  /** Seconds per product of the winner. */
  seconds: number;
}

/** How class winners are keyed (the class key, a coarse one), cached and checked. */
const CLASS_STORE: PickStore<MatmulClass, ClassRecord> = {
  tuner: "matmulTuning",
  version: TUNER_VERSION,
  keyOf: matmulClassKey,
  check(gpu, entry) {
    const { dtype, orientation, size } = entry.shape;
    // Only a candidate this device's profile still offers (f16 tiles are the smaller ones)
    // for the class's dtype (subgroup-matrix tilings take f16 only).
    const pick = matmulCandidates(gpu, "f16").find((c) =>
      JSON.stringify(c) === JSON.stringify(entry.pick)
    );
    const takes = pick && (tilingKind(pick).dtypes ?? [dtype]).includes(dtype);
    return takes
      ? { shape: { dtype, orientation, size }, pick, seconds: entry.seconds }
      : undefined;
  },
};

/** The problem of `c` with its operands laid out for the orientation. */
function problemOf(c: MatmulClass): MatmulProblem {
  const [m, n, k] = REPRESENTATIVE[c.size];
  return denseProblem({ batch: 1, m, n, k }, c.orientation);
}

/** Measures every candidate on `c`'s problem with `timer`: the winner and every speed. */
async function tuneClass(
  gpu: Gpu,
  c: MatmulClass,
  timer: CandidateTimer<MatmulTiling>,
): Promise<{ best: MatmulTiling; measurements: TilingMeasurement[] }> {
  const problem = problemOf(c);
  const { m, n, k } = problem;
  const dtype = c.dtype;
  const operands = {
    a: DeviceArray.filled([m * k], 0.5, dtype, gpu),
    b: DeviceArray.filled([k * n], 0.25, dtype, gpu),
    c: DeviceArray.empty([m * n], dtype, gpu),
  };
  const candidates = matmulCandidates(gpu, dtype);
  let timed: { best: MatmulTiling; seconds: number[] };
  try {
    timed = await timeCandidates(candidates, (tiling) =>
      timer(
        tiling,
        () => launchMatmulInto(problem, operands.a, operands.b, operands.c, {}, tiling),
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
  return { best: timed.best, measurements };
}

/**
 * Tunes the matmul classes `options.classes` (default: those
 * `initGpu({ tuning: "eager" })` tunes) on `gpu`, records each winner in
 * `matmulSettings.of(gpu).classTilings` (which dispatch reads) and caches
 * them per adapter. A class with a cached winner is not measured again
 * unless `force` is set. Lazy tuning runs it for one class at the wait after
 * the class first ran. Waits for the GPU many times: call it at start-up or
 * between steps, never in one.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, tuneMatmul } from "../../mod.ts";
 * import { matmulSettings } from "./settings.ts";
 * import { matmulClassKey } from "./matmul_class.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const [result] = await tuneMatmul(gpu, {
 *   classes: [{ dtype: "f32", orientation: "nt", size: "small" }],
 * });
 * const { classTilings } = matmulSettings.of(gpu);
 * assert.equal(classTilings.get(matmulClassKey(result.class)), result.best);
 * gpu.destroy();
 * ```
 */
export async function tuneMatmul(
  gpu: Gpu,
  options: TuneMatmulOptions = {},
): Promise<ClassTuning[]> {
  const measured = new Map<string, TilingMeasurement[]>();
  const classes = options.classes ?? defaultTuningClasses(gpu);
  const listed = classes.map((c) => ({ shape: c, problem: problemOf(c) }));
  const outcomes = await tuneClasses(
    gpu,
    CLASS_STORE,
    MATMUL_CLASS_TASK,
    listed,
    options,
    async (c, _, timer) => {
      const { best, measurements } = await tuneClass(gpu, c, timer);
      measured.set(matmulClassKey(c), measurements);
      const seconds = Math.min(...measurements.map((x) => x.seconds));
      return { record: { shape: c, pick: best, seconds }, trials: measurements.length };
    },
  );
  const { classTilings } = matmulSettings.of(gpu);
  return outcomes.map(({ key, record, cached }, i) => {
    classTilings.set(key, record.pick);
    const measurements = measured.get(key) ?? [];
    return { class: classes[i], best: record.pick, measurements, cached };
  });
}

/**
 * Gives dispatch the winner of each class `initGpu({ tuning: "eager" })`
 * would tune ({@link defaultTuningClasses}) that the per-user cache holds
 * for `gpu`, measuring nothing, as eager tuning does with a full cache:
 * lazy tuning then measures only the classes missing.
 */
export function useCachedMatmulTilings(gpu: Gpu): void {
  const { classTilings } = matmulSettings.of(gpu);
  const cached = readPicks(gpu, CLASS_STORE);
  for (const c of defaultTuningClasses(gpu)) {
    const record = cached.get(matmulClassKey(c));
    if (record) classTilings.set(matmulClassKey(c), record.pick);
  }
}
