/**
 * Picks the fused attention kernels' plan (rows per workgroup, rows staged in
 * workgroup memory) per adapter and dtype by timing them, as the matmul tuner
 * does for tilings: every candidate runs forward and backward on one
 * representative problem (with GPU timestamps where the adapter has them),
 * and the winner is cached per adapter in the per-user store.
 */
import type { AttentionPlan } from "./plans.ts";
import type { Gpu } from "../../device/gpu.ts";
import type { FloatDType } from "../../base/dtype.ts";
import {
  ATTENTION_PLAN_CANDIDATES,
  attentionPlanCandidates,
  type FlashAttentionShape,
  launchFlashAttention,
  launchFlashAttentionBackward,
  TILED_ATTENTION_PLANS,
} from "./flash_attention.ts";
import { type CandidateTimer, timeCandidates } from "../../tuning/timing.ts";
import { type PickStore, readPicks } from "../../tuning/cache.ts";
import { DeviceArray } from "../../device/device_array.ts";
import {
  ATTENTION_PLAN_TASK,
  ATTENTION_SHAPE_STORE,
  ATTENTION_SHAPE_TASK,
  type AttentionProblem,
  attentionSettings,
  type AttentionShape,
  type AttentionShapeRecord,
} from "./settings.ts";
import {
  type ClassTuningOptions,
  type PickOutcome,
  pickReport,
  type ShapeTuningOptions,
  tuneClasses,
  tuneShapes,
} from "../../tuning/picks.ts";

/** Bump when the kernels or candidates change: cached winners of older versions are ignored. */
const TUNER_VERSION = 6;

/** One dtype's result. */
export interface AttentionTuning {
  /** Storage dtype. */
  dtype: FloatDType;
  /** The fastest plan. */
  best: AttentionPlan;
  /** Milliseconds of forward + backward per candidate (empty when cached). */
  measurements: { plan: AttentionPlan; ms: number }[];
  /** True when the winner came from the per-adapter cache. */
  cached: boolean;
}

/** A dtype's plan as the cache keeps it. */
interface DtypeRecord {
  /** The storage dtype (the coarse key). */
  shape: FloatDType;
  /** Its plan. */
  pick: AttentionPlan;
  /** Seconds of forward + backward with the plan. */
  seconds: number;
}

/** How each dtype's plan is keyed, cached and checked. */
const DTYPE_STORE: PickStore<FloatDType, DtypeRecord> = {
  tuner: "attentionTuning",
  version: TUNER_VERSION,
  keyOf: (dtype) => dtype,
  check(gpu, entry) {
    const pick = [
      ...ATTENTION_PLAN_CANDIDATES,
      ...TILED_ATTENTION_PLANS,
      // The tuning problem's head size (64): the subgroup-matrix pairings of f16.
      ...attentionPlanCandidates(gpu, 64, "f16").filter((p) => p.matrix),
    ].find((c) => JSON.stringify(c) === JSON.stringify(entry.pick));
    return pick && { shape: entry.shape, pick, seconds: entry.seconds };
  },
};

/**
 * The problem each candidate runs. On GPUs a nanoGPT-size GPT's attention
 * (B = 64, H = 6, T = 256, D = 64): B·H = 384 heads fill the device the way
 * training does (a few heads leave most of a GPU idle and rank the plans by
 * latency). On CPU adapters 8 heads over T = 128 (more take seconds each).
 */
export function attentionTuningProblem(gpu: Gpu): FlashAttentionShape {
  return gpu.adapterProfile.cpu
    ? { batch: 2, heads: 4, headSize: 64, t: 128 }
    : { batch: 64, heads: 6, headSize: 64, t: 256 };
}

/**
 * Each plan candidate's seconds of forward + backward on `problem` (packed
 * q, k, v: the layout CausalSelfAttention runs), the fastest, and how many
 * timings that took. The scratch tensors are made at the first run (an
 * injected timer that never runs allocates nothing).
 */
async function timePlans(
  gpu: Gpu,
  problem: AttentionProblem,
  dtype: FloatDType,
  timer: CandidateTimer<AttentionPlan>,
): Promise<
  { candidates: readonly AttentionPlan[]; best: AttentionPlan; seconds: number[]; trials: number }
> {
  const { batch, t, heads, headSize } = problem, c = heads * headSize;
  let scratch: { qkv: DeviceArray; dout: DeviceArray } | undefined;
  const candidates = attentionPlanCandidates(gpu, headSize, dtype);
  let trials = 0;
  try {
    const timed = await timeCandidates(candidates, (plan) => {
      trials++;
      const s = { batch, t, heads, headSize, plan };
      return timer(plan, () => {
        const { qkv, dout } = scratch ??= {
          qkv: DeviceArray.filled([batch, t, 3 * c], 0.5, dtype, gpu),
          dout: DeviceArray.filled([batch, t, c], 0.01, dtype, gpu),
        };
        const { o, lse } = launchFlashAttention({ qkv }, s, null);
        const grads = launchFlashAttentionBackward({ inputs: { qkv }, o, lse }, dout, s, null);
        for (const x of [o, lse, ...grads]) x.dispose();
      });
    });
    return { candidates, ...timed, trials };
  } finally {
    if (scratch) { for (const x of [scratch.qkv, scratch.dout]) x.dispose(); }
  }
}

/** Options of {@link tuneAttention}. */
export interface TuneAttentionOptions extends ClassTuningOptions<AttentionPlan> {
  /** Storage dtypes to tune (default: every one the device has). */
  dtypes?: readonly FloatDType[];
}

/**
 * Times the fused attention kernels with each plan candidate for every dtype
 * the device has (f32 and bf16, and f16 with `shader-f16`; or `dtypes`),
 * records the winners in `attentionSettings.of(gpu).plans`
 * (which the kernels read) and caches them per adapter. `initGpu` calls it
 * at start-up with `tuning: "eager"`, and for one dtype at the wait after
 * the dtype's attention first ran with `"lazy"`. Waits for the GPU many
 * times: call it at start-up or between steps.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, tuneAttention } from "../../mod.ts";
 * import { attentionSettings } from "./settings.ts";
 * const gpu = await initGpu({ matmulTiling: "default" }); // no tuning at start-up
 * const [f32] = await tuneAttention(gpu);
 * assert.equal(attentionSettings.of(gpu).plans.get("f32"), f32.best);
 * gpu.destroy();
 * ```
 */
export async function tuneAttention(
  gpu: Gpu,
  options: TuneAttentionOptions = {},
): Promise<AttentionTuning[]> {
  const measured = new Map<string, { plan: AttentionPlan; ms: number }[]>();
  const dtypes = options.dtypes ?? deviceDtypes(gpu);
  const listed = dtypes.map((dtype) => ({ shape: dtype, problem: attentionTuningProblem(gpu) }));
  const outcomes = await tuneClasses(
    gpu,
    DTYPE_STORE,
    ATTENTION_PLAN_TASK,
    listed,
    options,
    async (dtype, problem, timer) => {
      const timed = await timePlans(gpu, problem, dtype, timer);
      const ms = timed.candidates.map((plan, i) => ({ plan, ms: timed.seconds[i] * 1000 }));
      measured.set(dtype, ms);
      const record = { shape: dtype, pick: timed.best, seconds: Math.min(...timed.seconds) };
      return { record, trials: timed.trials };
    },
  );
  const { plans } = attentionSettings.of(gpu);
  return outcomes.map(({ key, record, cached }) => {
    plans.set(key, record.pick);
    return {
      dtype: record.shape,
      best: record.pick,
      measurements: measured.get(key) ?? [],
      cached,
    };
  });
}

/** One attention shape's tuning: its plan, and its time where this run or the cache has one. */
export interface AttentionShapeTuning {
  /** The shape: B·H, T, D, dtype. */
  shape: AttentionShape;
  /** Its key (`"f32/bh384/t256/d64"`). */
  key: string;
  /** The plan it runs. */
  plan: AttentionPlan;
  /** Seconds of forward + backward with the plan (measured by this run, or when cached). */
  seconds: number;
  /** Timings this run made for it (0 when it had a pick). */
  trials: number;
  /** True when the pick came from the per-adapter cache. */
  cached: boolean;
}

/**
 * Options of {@link tuneAttentionShapes}; listed shapes are timed as
 * B = B·H heads of one (the default, every shape run, at its own B and H).
 */
export type TuneAttentionShapesOptions = ShapeTuningOptions<AttentionShape, AttentionPlan>;

/**
 * Tunes the fused attention kernels at their own shapes on GPUs: each
 * (B·H, T, D, dtype) the kernels ran (or `options.shapes`) without a pick is
 * timed with every plan candidate at that shape — the real number of heads,
 * not a representative problem — and the fastest is kept per device,
 * cached per adapter, and run by later steps (gpu/kernels/attention/settings.ts).
 * Budget: one timing per candidate and three finalists again (about 15 per
 * shape; a GPT has one attention shape per dtype). On CPU adapters it does
 * nothing and returns none. Waits for the GPU many times: call it between
 * steps (after the first), never in one.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { fusedCausalAttention, initGpu, Tensor, tuneAttentionShapes } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const q = Tensor.full([1, 8, 32], 0.1);
 * fusedCausalAttention(q, q, q, { heads: 2 }).dispose(); // a first step
 * const picks = await tuneAttentionShapes(gpu);
 * assert.equal(picks.length, gpu.adapterProfile.cpu ? 0 : 1);
 * gpu.destroy();
 * ```
 */
export async function tuneAttentionShapes(
  gpu: Gpu,
  options: TuneAttentionShapesOptions = {},
): Promise<AttentionShapeTuning[]> {
  if (gpu.adapterProfile.cpu) return [];
  const outcomes = await tuneShapes(
    gpu,
    attentionSettings.of(gpu).shapes,
    ATTENTION_SHAPE_STORE,
    ATTENTION_SHAPE_TASK,
    options,
    (shape) => ({ batch: shape.heads, heads: 1, t: shape.t, headSize: shape.headSize }),
    async (shape, problem, timer) => {
      const timed = await timePlans(gpu, problem, shape.dtype, timer);
      const record = { shape, plan: timed.best, seconds: Math.min(...timed.seconds) };
      return { record, trials: timed.trials };
    },
  );
  return outcomes.map(shapeTuning);
}

/**
 * Every per-shape attention pick `gpu` holds, with its time (shape → plan →
 * time, as the benchmark prints). Empty on CPU adapters.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { attentionShapeReport, initGpu } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.ok(Array.isArray(attentionShapeReport(gpu)));
 * gpu.destroy();
 * ```
 */
export function attentionShapeReport(gpu: Gpu): AttentionShapeTuning[] {
  if (gpu.adapterProfile.cpu) return [];
  return pickReport(attentionSettings.of(gpu).shapes).map(shapeTuning);
}

/** An outcome as the report's row. */
function shapeTuning(
  { key, record, trials, cached }: PickOutcome<AttentionShapeRecord>,
): AttentionShapeTuning {
  const { shape, plan, seconds } = record;
  return { shape, key, plan, seconds, trials, cached };
}

/**
 * Gives the kernels the plan of each of `gpu`'s dtypes that the per-user
 * cache holds (measuring nothing): lazy tuning then measures only the
 * dtypes missing.
 */
export function useCachedAttentionPlans(gpu: Gpu): void {
  const { plans } = attentionSettings.of(gpu);
  const cached = readPicks(gpu, DTYPE_STORE);
  for (const dtype of deviceDtypes(gpu)) {
    const record = cached.get(dtype);
    if (record) plans.set(dtype, record.pick);
  }
}

/** The storage dtypes `gpu` runs attention in (bf16 needs no shader-f16: every adapter has it). */
function deviceDtypes(gpu: Gpu): FloatDType[] {
  return gpu.f16 ? ["f32", "f16", "bf16"] : ["f32", "bf16"];
}
