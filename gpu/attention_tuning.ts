/**
 * Picks the fused attention kernels' plan (rows per workgroup, rows staged in
 * workgroup memory) per adapter and dtype by timing them, as the matmul tuner
 * does for tilings: every candidate runs forward and backward on one
 * representative problem (with GPU timestamps where the adapter has them),
 * and the winner is cached per adapter in `localStorage` when the runtime
 * offers it.
 */
import type { AttentionPlan, Gpu } from "./device.ts";
import {
  ATTENTION_PLAN_CANDIDATES,
  attentionPlanCandidates,
  type FlashAttentionShape,
  launchFlashAttention,
  launchFlashAttentionBackward,
  TILED_ATTENTION_PLANS,
} from "./kernels/flash_attention.ts";
import {
  type CandidateTimer,
  progressReporter,
  secondsPerRun,
  timeCandidates,
  tunerCacheKey,
  type TuningProgress,
  winnerCache,
} from "./kernel_timing.ts";
import { untracked } from "./scope.ts";
import { Tensor } from "./tensor.ts";
import { attentionSettings } from "./attention_picks.ts";

/** Bump when the kernels or candidates change: cached winners of older versions are ignored. */
const TUNER_VERSION = 4;

/** One dtype's result. */
export interface AttentionTuning {
  /** Storage dtype. */
  dtype: "f32" | "f16";
  /** The fastest plan. */
  best: AttentionPlan;
  /** Milliseconds of forward + backward per candidate (empty when cached). */
  measurements: { plan: AttentionPlan; ms: number }[];
  /** True when the winner came from the per-adapter cache. */
  cached: boolean;
}

function cacheOf(gpu: Gpu) {
  return winnerCache(
    tunerCacheKey(gpu, "attentionTuning", TUNER_VERSION),
    (stored) =>
      [...ATTENTION_PLAN_CANDIDATES, ...TILED_ATTENTION_PLANS].find((c) =>
        JSON.stringify(c) === JSON.stringify(stored)
      ),
  );
}

/**
 * The problem each candidate runs. On GPUs a nanoGPT-size GPT's attention
 * (B = 64, H = 6, T = 256, D = 64): B·H = 384 heads fill the device the way
 * training does (8 heads left most of an H100 idle and ranked the plans by
 * latency). On CPU adapters 8 heads over T = 128 (more take seconds each).
 */
export function attentionTuningProblem(gpu: Gpu): FlashAttentionShape {
  return gpu.adapterProfile.cpu
    ? { batch: 2, heads: 4, headSize: 64, t: 128 }
    : { batch: 64, heads: 6, headSize: 64, t: 256 };
}

async function tuneDtype(
  gpu: Gpu,
  dtype: "f32" | "f16",
  timer: CandidateTimer<AttentionPlan>,
): Promise<AttentionTuning> {
  const shape = attentionTuningProblem(gpu);
  const c = shape.heads * shape.headSize;
  // Packed q, k, v: the layout CausalSelfAttention runs.
  const [qkv, dout] = untracked(() => [
    Tensor.full([shape.batch, shape.t, 3 * c], 0.5, { dtype, gpu }),
    Tensor.full([shape.batch, shape.t, c], 0.01, { dtype, gpu }),
  ]);
  const candidates = attentionPlanCandidates(gpu, shape.headSize);
  let timed: { best: AttentionPlan; seconds: number[] };
  try {
    timed = await timeCandidates(candidates, (plan) => {
      const s = { ...shape, plan };
      return timer(plan, () =>
        untracked(() => {
          const { o, lse } = launchFlashAttention({ qkv }, s, null);
          const grads = launchFlashAttentionBackward({ inputs: { qkv }, o, lse }, dout, s, null);
          for (const t of [o, lse, ...grads]) t.dispose();
        }));
    });
  } finally {
    for (const t of [qkv, dout]) t.dispose();
  }
  const measurements = candidates.map((plan, i) => ({ plan, ms: timed.seconds[i] * 1000 }));
  const best = timed.best;
  return { dtype, best, measurements, cached: false };
}

/**
 * Times the fused attention kernels with each plan candidate for every dtype
 * the device has, records the winners in `attentionSettings.of(gpu).plans`
 * (which the kernels read) and caches them per adapter. `initGpu` calls it
 * unless told not to tune. Waits for the GPU many times: call it at start-up.
 *
 * @example
 * ```ts
 * import { initGpu, tuneAttention } from "./mod.ts";
 * import { attentionSettings } from "./attention_picks.ts";
 * const gpu = await initGpu({ matmulTiling: "default" }); // no tuning at start-up
 * const [f32] = await tuneAttention(gpu);
 * console.assert(attentionSettings.of(gpu).plans.get("f32") === f32.best);
 * gpu.destroy();
 * ```
 */
export async function tuneAttention(
  gpu: Gpu,
  options: {
    force?: boolean;
    onProgress?: (progress: TuningProgress) => void;
    /** Times a candidate's run (default: GPU timestamps, else wall time); given, the cache is skipped. */
    timer?: CandidateTimer<AttentionPlan>;
  } = {},
): Promise<AttentionTuning[]> {
  const cache = cacheOf(gpu);
  const timer = options.timer ?? ((_, run) => secondsPerRun(gpu, run));
  const cached = options.force || options.timer ? {} : cache.read();
  const results: AttentionTuning[] = [];
  const { plans } = attentionSettings.of(gpu);
  const dtypes = gpu.f16 ? (["f32", "f16"] as const) : (["f32"] as const);
  const missing = dtypes.filter((d) => cached[d] === undefined).length;
  const measured = progressReporter("attention plans", missing, options.onProgress);
  for (const dtype of dtypes) {
    const hit = cached[dtype];
    const result = hit !== undefined
      ? { dtype, best: hit, measurements: [], cached: true }
      : await tuneDtype(gpu, dtype, timer);
    if (hit === undefined) measured();
    plans.set(dtype, result.best);
    results.push(result);
  }
  if (!options.timer) cache.write(plans);
  return results;
}
