/**
 * The fused attention kernels' tuning settings on one device: the plan
 * `tuneAttention` picked per dtype (at start-up, from the cache, or at the
 * wait after the dtype first ran: gpu/tuning/lazy.ts), and on GPUs a pick
 * per attention shape (B·H, T, D, dtype) timed at that shape by
 * `tuneAttentionShapes` (gpu/kernels/attention/tuner.ts) — the real number of heads
 * fills the device the way training does, which a representative problem
 * only guesses. As with matmul shapes (gpu/kernels/gemm/shape_picks.ts, which says why
 * tuning runs between steps, never at first sight), dispatch notes each
 * shape on GPUs and runs the dtype's plan until its shape is tuned; picks
 * are cached per adapter in the per-user store (versioned key; each entry
 * names its adapter and is checked against the candidates before use) and
 * read when a device first runs attention. CPU adapters keep the dtype's plan.
 */
import type { Gpu } from "../../device/gpu.ts";
import { type DType, DTYPES, type FloatDType } from "../../base/dtype.ts";
import { type AttentionPlan, attentionPlanCandidates, type FlashAttentionShape } from "./plans.ts";
import { pickCacheKey, type PickStore } from "../../tuning/cache.ts";
import { cachedPicks, emptyPicks, type ShapePicks } from "../../tuning/picks.ts";
import { defineTunerSettings, type TunerSettings } from "../../tuning/settings.ts";
import { noteUntuned } from "../../tuning/lazy.ts";

/** Bump when the kernels, candidates or the key change: older cached picks are ignored. */
const ATTENTION_SHAPES_VERSION = 2;

/** The tasks under which the attention tuners' work is reported and noted for lazy tuning. */
export const ATTENTION_PLAN_TASK = "attention plans", ATTENTION_SHAPE_TASK = "attention shapes";

/** What an attention pick is for: heads in all (B·H), sequence length, head size, dtype. */
export interface AttentionShape {
  /** B·H: batch times heads (the kernels' grid runs over both alike). */
  heads: number;
  /** Sequence length T. */
  t: number;
  /** Head size D. */
  headSize: number;
  /** Storage dtype of q, k and v. */
  dtype: FloatDType;
}

/** An attention problem as the kernels see it: batch B, heads H, sequence length T, head size D. */
export interface AttentionProblem {
  /** Batch B. */
  batch: number;
  /** Heads H. */
  heads: number;
  /** Sequence length T. */
  t: number;
  /** Head size D. */
  headSize: number;
}

/** A shape's pick and its time (forward + backward) when it was measured. */
export interface AttentionShapeRecord {
  /** The shape. */
  shape: AttentionShape;
  /** The plan it runs. */
  plan: AttentionPlan;
  /** Seconds of forward + backward with the plan. */
  seconds: number;
}

/** The fused attention kernels' settings of one device (see {@link attentionSettings}). */
export interface AttentionSettings {
  /** The plan of each storage dtype (`tuneAttention` fills it; unset: 64 rows, nothing staged). */
  readonly plans: Map<string, AttentionPlan>;
  /**
   * Per-shape picks on GPUs by {@link attentionShapeKey} (read from the
   * cache on first use), and every shape run there with a problem of
   * theirs (B and H apart), for `tuneAttentionShapes`.
   */
  readonly shapes: ShapePicks<AttentionShape, AttentionShapeRecord, AttentionProblem>;
}

/**
 * The fused attention settings of a device (`attentionSettings.of(gpu)`);
 * tests set `plans` to force a plan.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../../mod.ts";
 * import { attentionSettings } from "./settings.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.equal(attentionSettings.of(gpu).plans.size, 0, "nothing tuned");
 * gpu.destroy();
 * ```
 */
export const attentionSettings: TunerSettings<AttentionSettings> = defineTunerSettings(
  "attention",
  (gpu) => ({
    plans: new Map(),
    shapes: gpu.adapterProfile.cpu ? emptyPicks() : cachedPicks(gpu, ATTENTION_SHAPE_STORE),
  }),
);

/** The key of an attention shape, e.g. `"f32/bh384/t256/d64"`. */
export function attentionShapeKey(s: AttentionShape): string {
  return `${s.dtype}/bh${s.heads}/t${s.t}/d${s.headSize}`;
}

/** The attention shape of `problem` with q, k, v stored in `dtype`. */
export function attentionShapeOf(problem: AttentionProblem, dtype: DType): AttentionShape {
  const { batch, heads, t, headSize } = problem;
  // bf16 is keyed apart from f32: its kernels read half the bytes and widen them.
  return { heads: batch * heads, t, headSize, dtype: dtype === "i32" ? "f32" : dtype };
}

/** How attention picks are keyed, cached and checked (gpu/tuning/cache.ts). @internal */
export const ATTENTION_SHAPE_STORE: PickStore<AttentionShape, AttentionShapeRecord> = {
  tuner: "attentionShapes",
  version: ATTENTION_SHAPES_VERSION,
  keyOf: attentionShapeKey,
  check(gpu, entry) {
    const { heads, t, headSize, dtype } = entry.shape;
    if (![heads, t, headSize].every((c) => Number.isInteger(c) && c > 0)) return undefined;
    if (!DTYPES.includes(dtype)) return undefined;
    const plan = attentionPlanCandidates(gpu, headSize, dtype).find((c) =>
      JSON.stringify(c) === JSON.stringify(entry.plan)
    );
    return plan && { shape: { heads, t, headSize, dtype }, plan, seconds: entry.seconds };
  },
};

/**
 * The `localStorage` key of `gpu`'s cached attention picks (per adapter,
 * profile and version). @internal
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../../mod.ts";
 * import { attentionShapeCacheKey } from "./settings.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.match(attentionShapeCacheKey(gpu), /^halfstep\.attentionShapes\./);
 * gpu.destroy();
 * ```
 */
export function attentionShapeCacheKey(gpu: Gpu): string {
  return pickCacheKey(gpu, ATTENTION_SHAPE_STORE);
}

/**
 * The plan the fused attention kernels use for `problem` in `dtype` on
 * `gpu`, before fitting it to T and D: on GPUs the shape's own pick once
 * tuned (the shape is noted for `tuneAttentionShapes`), else the dtype's
 * tuned plan, else undefined (the kernels' default). What has no pick yet is
 * noted for lazy tuning.
 */
export function attentionPlanFor(
  gpu: Gpu,
  dtype: DType,
  problem: FlashAttentionShape,
): AttentionPlan | undefined {
  const settings = attentionSettings.of(gpu);
  const { batch, heads, t, headSize } = problem;
  // Score multiply-adds, for whether the shape is worth tuning lazily.
  const work = batch * heads * t * t * headSize;
  if (!gpu.adapterProfile.cpu) {
    const shape = attentionShapeOf(problem, dtype);
    const key = attentionShapeKey(shape);
    if (!settings.shapes.seen.has(key)) {
      settings.shapes.seen.set(key, { shape, problem: { batch, heads, t, headSize } });
    }
    const pick = settings.shapes.picks.get(key)?.plan;
    if (pick) return pick;
    noteUntuned(gpu, ATTENTION_SHAPE_TASK, key, shape, work);
  }
  const plan = settings.plans.get(dtype);
  if (!plan) noteUntuned(gpu, ATTENTION_PLAN_TASK, dtype, dtype, work);
  return plan;
}
