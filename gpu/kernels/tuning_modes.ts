/**
 * When the kernel families are tuned: `initGpu({ tuning })`. `"lazy"`
 * (the default) gives dispatch every pick the per-user cache holds and
 * tunes the rest as it first runs, at waits (gpu/tuning/lazy.ts says how,
 * within which budget, and what stays bit for bit); `"eager"` tunes every
 * matmul class and attention dtype of the adapter before `initGpu`
 * returns (40 s to 2 min on a CPU adapter the first time); `"off"` runs
 * the default tiling and plans. This file is where the lazy queue meets
 * the families' tuners.
 */
import type { Gpu } from "../device/gpu.ts";
import type { FloatDType } from "../base/dtype.ts";
import type { TuningProgress } from "../tuning/timing.ts";
import { type LazyRunner, lazyTuning, tuneAtWait, type TuningMode } from "../tuning/lazy.ts";
import { tuneMatmul, useCachedMatmulTilings } from "./gemm/class_tuner.ts";
import { tuneMatmulShapes } from "./gemm/shape_tuner.ts";
import { MATMUL_CLASS_TASK, type MatmulClass } from "./gemm/matmul_class.ts";
import { MATMUL_SHAPE_TASK, type MatmulShape } from "./gemm/shape_picks.ts";
import { tuneAttention, tuneAttentionShapes, useCachedAttentionPlans } from "./attention/tuner.ts";
import {
  ATTENTION_PLAN_TASK,
  ATTENTION_SHAPE_TASK,
  type AttentionShape,
} from "./attention/settings.ts";

/** Each family's tuner of one noted key, in the order the tasks go: coarse keys first. */
const LAZY_RUNNERS: [string, LazyRunner][] = [
  [MATMUL_CLASS_TASK, (g, c, timer) => tuneMatmul(g, { classes: [c as MatmulClass], timer })],
  [ATTENTION_PLAN_TASK, (g, d, timer) => tuneAttention(g, { dtypes: [d as FloatDType], timer })],
  [MATMUL_SHAPE_TASK, (g, s, timer) => tuneMatmulShapes(g, { shapes: [s as MatmulShape], timer })],
  [
    ATTENTION_SHAPE_TASK,
    (g, s, t) => tuneAttentionShapes(g, { shapes: [s as AttentionShape], timer: t }),
  ],
];

/**
 * Starts `gpu`'s tuning in `mode` (see the module comment); `onProgress`
 * is told how each tuning run goes.
 */
export async function startTuning(
  gpu: Gpu,
  mode: TuningMode,
  onProgress?: (progress: TuningProgress) => void,
): Promise<void> {
  if (mode === "lazy") return startLazyTuning(gpu, onProgress);
  lazyTuning.of(gpu).mode = mode;
  if (mode === "off") return;
  await tuneMatmul(gpu, { onProgress });
  await tuneAttention(gpu, { onProgress });
  // The search's scratch buffers should not show up in the user's figures.
  gpu.pool.releaseCached();
  gpu.resetPeakMemory();
}

/**
 * Turns lazy tuning on for `gpu`: the cached class winners and attention
 * plans go to dispatch, each family's tuner stands behind the queue
 * (classes and dtypes first, then GPU shapes), and every wait of the device
 * tunes what is pending within the budget. Tests call it with a fake
 * `lazyTuning.of(gpu).timer` and `clock` set afterwards.
 */
export function startLazyTuning(
  gpu: Gpu,
  onProgress?: (progress: TuningProgress) => void,
): void {
  const lazy = lazyTuning.of(gpu);
  lazy.mode = "lazy";
  lazy.onProgress = onProgress;
  for (const [task, run] of LAZY_RUNNERS) lazy.runners.set(task, run);
  useCachedMatmulTilings(gpu);
  useCachedAttentionPlans(gpu);
  gpu.setWaitWork(async (g) => void await tuneAtWait(g));
}
