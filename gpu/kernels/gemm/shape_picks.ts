/**
 * Per-shape matmul picks on GPUs: the tiling and split-K slice count chosen
 * for one exact product shape (m, n, k, batch, orientation, dtypes,
 * epilogue), which dispatch prefers to its class's winner. CPU adapters keep
 * the class rule (`matmul_class.ts`): nothing here runs for them.
 *
 * Design (why tuning is not done at first sight): timing a candidate needs a
 * GPU wait, and nothing in a training step may read back, so a product of a
 * new shape runs with its class's winner, and dispatch only notes the shape
 * (a map insert), for `tuneMatmulShapes` and for lazy tuning. With
 * `initGpu({ tuning: "lazy" })` (the default) the next wait tunes it
 * (gpu/tuning/lazy.ts); otherwise `await tuneMatmulShapes(gpu)`
 * (shape_tuner.ts), called between steps, times the noted shapes. Either
 * records their picks here; later steps dispatch them. Picks are cached per
 * adapter in the per-user store (versioned key; each entry names its
 * adapter and is checked against the candidates before use), and read when
 * a device first dispatches on a GPU adapter, so a second run uses them
 * without tuning again.
 */
import type { MatmulTiling } from "./settings.ts";
import type { Gpu } from "../../device/gpu.ts";
import type { DType, FloatDType } from "../../base/dtype.ts";
import { classOf, type MatmulOrientation, type MatmulProblem } from "./matmul_class.ts";
import { pickCacheKey, type PickStore } from "../../tuning/cache.ts";
import { cachedPicks, type ShapePicks } from "../../tuning/picks.ts";
import { tilingFits, tilingKind } from "./tilings.ts";
import { maxSlices } from "./gemm.ts";
import type { Activation } from "../wgsl/math.ts";
import { matmulCandidates } from "./candidates.ts";
import { defineTunerSettings, type TunerSettings } from "../../tuning/settings.ts";
import { noteUntuned } from "../../tuning/lazy.ts";

/** Bump when kernels or the pick's meaning change: older cached picks are ignored. */
const SHAPE_PICKS_VERSION = 1;

/** The task under which the shape tuner's work is reported and noted for lazy tuning. */
export const MATMUL_SHAPE_TASK = "matmul shapes";

/** One product's exact shape: what a per-shape pick is for. */
export interface MatmulShape {
  /** Rows of the result. */
  m: number;
  /** Columns of the result. */
  n: number;
  /** The inner size. */
  k: number;
  /** Batch count. */
  batch: number;
  /** Which operand is read transposed. */
  orientation: MatmulOrientation;
  /** Storage dtype of A and B. */
  dtype: FloatDType;
  /** Storage dtype of C. */
  out: FloatDType;
  /** Bias dtype, or "none". */
  bias: FloatDType | "none";
  /** Activation after the bias. */
  activation: Activation;
}

/** What a shape runs with: a tiling and how many slices of k (1: not split). */
export interface ShapePick {
  /** The tiling. */
  tiling: MatmulTiling;
  /** Split-K slices (1 with an epilogue: it acts on whole sums). */
  slices: number;
}

/** A shape's pick with its time on the tuner's problem. */
export interface ShapeRecord {
  /** The shape. */
  shape: MatmulShape;
  /** The pick. */
  pick: ShapePick;
  /** Seconds per product of the pick when it was measured (kept in the cache). */
  seconds: number;
}

/** The cache key of a shape, e.g. `"f32>f32/nt/b1/16384x1536x384/f32/gelu"`. */
export function matmulShapeKey(s: MatmulShape): string {
  return `${s.dtype}>${s.out}/${s.orientation}/b${s.batch}/${s.m}x${s.n}x${s.k}/` +
    `${s.bias}/${s.activation}`;
}

/** The shape of `problem` with operands in `dtype`, result in `out` and `epilogue`. */
export function shapeOf(
  problem: MatmulProblem,
  dtypes: { dtype: DType; out: DType },
  epilogue: { bias: DType | "none"; activation: Activation },
): MatmulShape {
  const half = (d: DType): FloatDType => d === "i32" ? "f32" : d;
  return {
    m: problem.m,
    n: problem.n,
    k: problem.k,
    batch: problem.batch,
    orientation: classOf(problem, dtypes.dtype).orientation,
    dtype: half(dtypes.dtype),
    out: half(dtypes.out),
    bias: epilogue.bias === "none" ? "none" : half(epilogue.bias),
    activation: epilogue.activation,
  };
}

/** The candidate of `gpu` for `shape`'s dtype equal to `tiling` (a cached pick's), if any. */
function candidateLike(
  gpu: Gpu,
  shape: MatmulShape,
  tiling: MatmulTiling,
): MatmulTiling | undefined {
  const text = JSON.stringify(tiling);
  return matmulCandidates(gpu, shape.dtype).find((c) => JSON.stringify(c) === text);
}

/** Whether `pick` can run `shape` on `gpu` (a cached pick is checked before it is trusted). */
export function pickFits(gpu: Gpu, shape: MatmulShape, pick: ShapePick): boolean {
  const known = candidateLike(gpu, shape, pick.tiling) !== undefined;
  const split = shape.bias === "none" && shape.activation === "none";
  return known && tilingKind(pick.tiling).forGpus &&
    tilingFits(pick.tiling, shape.dtype, gpu.adapterProfile.limits) &&
    Number.isInteger(pick.slices) && pick.slices >= 1 &&
    (pick.slices === 1 || split && pick.slices <= maxSlices(shape.k));
}

/** A device's picks and the shapes it dispatched (its matmul shape tuner's settings). */
export type ShapeState = ShapePicks<MatmulShape, ShapeRecord, MatmulProblem>;

/** How matmul picks are keyed, cached and checked (gpu/tuning/cache.ts). @internal */
export const MATMUL_SHAPE_STORE: PickStore<MatmulShape, ShapeRecord> = {
  tuner: "matmulShapes",
  version: SHAPE_PICKS_VERSION,
  keyOf: matmulShapeKey,
  check(gpu, entry) {
    if (!pickFits(gpu, entry.shape, entry.pick)) return undefined;
    const tiling = candidateLike(gpu, entry.shape, entry.pick.tiling)!;
    const shape = shapeFields(entry.shape);
    return { shape, pick: { tiling, slices: entry.pick.slices }, seconds: entry.seconds };
  },
};

/**
 * A device's per-shape matmul picks (gpu/tuning/settings.ts), read from the cache
 * when first used on a GPU adapter; a profile switch (`withAdapterProfile`)
 * starts fresh ones, read from that profile's cache.
 */
const shapeSettings: TunerSettings<ShapeState> = defineTunerSettings(
  "matmul shapes",
  (gpu) => cachedPicks(gpu, MATMUL_SHAPE_STORE),
);

/**
 * The `localStorage` key of `gpu`'s cached picks (per adapter, profile and
 * version). @internal
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../../mod.ts";
 * import { shapeCacheKey } from "./shape_picks.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.match(shapeCacheKey(gpu), /^halfstep\.matmulShapes\./);
 * gpu.destroy();
 * ```
 */
export function shapeCacheKey(gpu: Gpu): string {
  return pickCacheKey(gpu, MATMUL_SHAPE_STORE);
}

/** `s`'s fields only, in order (so its key is recomputed from what it says). */
function shapeFields(s: MatmulShape): MatmulShape {
  const { m, n, k, batch, orientation, dtype, out, bias, activation } = s;
  return { m, n, k, batch, orientation, dtype, out, bias, activation };
}

/** The per-shape state of `gpu` as it is now (read from the cache on first use per profile). */
export function shapeState(gpu: Gpu): ShapeState {
  return shapeSettings.of(gpu);
}

/**
 * Forgets `gpu`'s picks and noted shapes (as a new run starts): the next
 * dispatch reads the cache again. For tests and benchmarks. @internal
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../../mod.ts";
 * import { forgetMatmulShapes, shapeState } from "./shape_picks.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const before = shapeState(gpu);
 * forgetMatmulShapes(gpu);
 * assert.notEqual(shapeState(gpu), before); // made afresh, from the cache
 * gpu.destroy();
 * ```
 */
export function forgetMatmulShapes(gpu: Gpu): void {
  shapeSettings.reset(gpu);
}

/**
 * The pick dispatch uses for `shape` on `gpu`: on GPU adapters the shape's
 * own pick once tuned, else undefined (the class rule applies). The shape
 * is noted for `tuneMatmulShapes`, and for lazy tuning while it has no pick.
 */
export function shapePickFor(
  gpu: Gpu,
  problem: MatmulProblem,
  shape: () => MatmulShape,
): ShapePick | undefined {
  if (gpu.adapterProfile.cpu) return undefined;
  const state = shapeState(gpu);
  const s = shape();
  const key = matmulShapeKey(s);
  if (!state.seen.has(key)) state.seen.set(key, { shape: s, problem });
  const pick = state.picks.get(key)?.pick;
  if (!pick) noteUntuned(gpu, MATMUL_SHAPE_TASK, key, s, s.batch * s.m * s.n * s.k);
  return pick;
}
