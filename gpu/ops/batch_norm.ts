/**
 * Differentiable BatchNorm over axis 1 of [N, C], [N, C, L] or [N, C, H, W].
 * Parameters, running statistics and arithmetic are fp32; x may be stored in
 * f16 or bf16 (the output then is too). Running statistics are updated in place on the
 * GPU: nothing here reads back to the CPU.
 */
import { DTypeError, ShapeError, StateError, ValueError } from "../base/errors.ts";
import { isGradEnabled, record } from "../tensor/autograd.ts";
import { autocastInputsWidenedInKernel } from "../tensor/autocast_hook.ts";
import { isRecomputing } from "./checkpoint.ts";
import {
  type BatchNormView,
  launchBatchNorm,
  launchBatchNormBackward,
} from "../kernels/batch_norm.ts";
import { sameShape, shapeString } from "../base/shape.ts";
import { untracked } from "../tensor/scope.ts";
import { Tensor } from "../tensor/tensor.ts";

/** Options of {@link batchNorm}. */
export interface BatchNormOptions {
  /** Scale, f32 [C] (default none: 1). */
  weight?: Tensor | null;
  /** Shift, f32 [C] (default none: 0). */
  bias?: Tensor | null;
  /** Running mean, f32 [C], updated in place in training mode. */
  runningMean: Tensor;
  /** Running (unbiased) variance, f32 [C], updated in place in training mode. */
  runningVar: Tensor;
  /** Training mode normalises with batch statistics; eval mode with the running ones. */
  training: boolean;
  /**
   * Weight of the new batch statistic in the running average (default 0.1, as
   * PyTorch); `null`: the cumulative average, weight 1/(batches tracked + 1),
   * as PyTorch's `momentum=None`, counting batches in `numBatchesTracked`, or
   * without one in a counter kept for `runningMean` (see {@link batchNormCounter}).
   */
  momentum?: number | null;
  /**
   * i32 []: training batches seen, counted on the GPU with every update of
   * the running statistics (PyTorch's `num_batches_tracked`).
   */
  numBatchesTracked?: Tensor | null;
  /** Added to the variance before the square root (default 1e-5). */
  eps?: number;
  /**
   * Training only: update the running statistics (default true). Gradient
   * checkpointing passes false when it recomputes a forward pass, so the
   * statistics move once per step, not twice.
   */
  updateRunningStats?: boolean;
}

/**
 * The batch counters of cumulative averages whose caller gave none, by
 * running-mean tensor: the functional op keeps the count a BatchNorm layer
 * keeps in its `num_batches_tracked` buffer. A counter lives as long as its
 * running mean (freed when that is garbage-collected), outside any `tidy`.
 */
const implicitCounters = new WeakMap<Tensor, Tensor>();
const freeCounter = new FinalizationRegistry<Tensor>((counter) => {
  try {
    counter.dispose();
  } catch {
    // The device went first; its buffers went with it.
  }
});

function implicitCounter(runningMean: Tensor): Tensor {
  let counter = implicitCounters.get(runningMean);
  if (!counter) {
    counter = untracked(() => Tensor.zeros([], { dtype: "i32", gpu: runningMean.gpu }));
    implicitCounters.set(runningMean, counter);
    freeCounter.register(runningMean, counter);
  }
  return counter;
}

/**
 * The i32 [] batch count {@link batchNorm} keeps for `runningMean` when it
 * updates a cumulative average (`momentum: null`) without a
 * `numBatchesTracked` from the caller, or null before the first such update.
 * It is the live counter: save it beside the running statistics to resume
 * the average, or write a count into it after loading them.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { batchNorm, batchNormCounter, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const runningMean = Tensor.zeros([2]), runningVar = Tensor.full([2], 1);
 * const x = Tensor.from([1, 10, 3, 30], [2, 2]);
 * for (let i = 0; i < 3; i++) {
 *   batchNorm(x, { runningMean, runningVar, training: true, momentum: null }).dispose();
 * }
 * assert.equal(await batchNormCounter(runningMean)!.item(), 3);
 * assert.equal((await runningMean.read()).join(), "2,20"); // the mean of 3 equal batches
 * gpu.destroy();
 * ```
 */
export function batchNormCounter(runningMean: Tensor): Tensor | null {
  return implicitCounters.get(runningMean) ?? null;
}

function viewOf(x: Tensor): BatchNormView {
  if (x.dtype === "i32") {
    throw new DTypeError(`batchNorm: input ${x.describe()} must be f32, f16 or bf16.`);
  }
  if (x.rank < 2 || x.rank > 4) {
    throw new ShapeError(
      `batchNorm: input ${x.describe()} must be [N, C], [N, C, L] or [N, C, H, W] ` +
        "(channels on axis 1).",
    );
  }
  const [n, c, ...spatial] = x.shape;
  return { n, c, s: spatial.reduce((a, b) => a * b, 1) };
}

function checkVector(name: string, t: Tensor | null, x: Tensor, c: number): void {
  if (t === null) return;
  if (t.dtype !== "f32") {
    throw new DTypeError(
      `batchNorm: ${name} is ${t.describe()}, but BatchNorm keeps its parameters and ` +
        `statistics in fp32 (also for a half input, here ${x.describe()}). ` +
        `Make ${name} an f32 tensor of shape ${shapeString([c])}.`,
    );
  }
  if (!sameShape(t.shape, [c])) {
    throw new ShapeError(
      `batchNorm: ${name} is ${t.describe()}, but input ${x.describe()} has ${c} channels ` +
        `(axis 1): it must have shape ${shapeString([c])}.`,
    );
  }
  if (t.gpu !== x.gpu) {
    throw new ValueError(
      `batchNorm: ${name} ${t.describe()} and input ${x.describe()} are on ` +
        "different devices.",
    );
  }
}

function checkOptions(
  x: Tensor,
  view: BatchNormView,
  training: boolean,
  o: BatchNormOptions,
): void {
  const momentum = o.momentum === undefined ? 0.1 : o.momentum, eps = o.eps ?? 1e-5;
  if (momentum !== null && !(momentum >= 0 && momentum <= 1)) {
    throw new ValueError(`batchNorm: momentum must be in [0, 1] or null, got ${momentum}.`);
  }
  const counter = o.numBatchesTracked;
  if (counter && (counter.dtype !== "i32" || counter.size !== 1)) {
    throw new DTypeError(
      `batchNorm: numBatchesTracked must be an i32 tensor of one element, got ${counter.describe()}.`,
    );
  }
  if (!(eps >= 0) || !Number.isFinite(eps)) {
    throw new ValueError(`batchNorm: eps must be a finite number ≥ 0, got ${eps}.`);
  }
  if (training && view.n * view.s <= 1 && view.c > 0) {
    throw new ShapeError(
      `batchNorm: expected more than 1 value per channel when training, got input ` +
        `${x.describe()} (${view.n * view.s} per channel). Use a larger batch or eval mode.`,
    );
  }
}

/**
 * BatchNorm with channels on axis 1: y = (x − μ) / √(σ² + eps) · weight + bias
 * per channel. In training mode μ and σ² (biased) are the batch's, over N and
 * the spatial axes, and `runningMean` / `runningVar` are updated in place on
 * the GPU as PyTorch does (running = (1 − momentum)·running + momentum·stat,
 * with the unbiased variance for `runningVar`) unless `updateRunningStats` is
 * false. In eval mode the running statistics normalise.
 *
 * `weight`, `bias` (or null), `runningMean` and `runningVar` must be f32 [C];
 * `x` may be f32, f16 or bf16 and y has its dtype, while every statistic and all the
 * arithmetic stay f32. Gradients: dx in x's dtype, dweight and dbias in f32.
 * Saved for backward: x (shared, no copy), the weight, and the mean and rstd
 * the forward used (f32 [C]), so later running-stat updates cannot change it.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { batchNorm, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const c = 2;
 * const x = Tensor.from([1, 10, 3, 30], [2, c]); // [N, C]
 * const weight = Tensor.full([c], 1, { requiresGrad: true });
 * const bias = Tensor.zeros([c], { requiresGrad: true });
 * const runningMean = Tensor.zeros([c]), runningVar = Tensor.full([c], 1);
 * const y = batchNorm(x, { weight, bias, runningMean, runningVar, training: true });
 * const z = batchNorm(x, { weight, bias, runningMean, runningVar, training: false });
 * const [m0, m1] = await runningMean.read(); // 0.9 · 0 + 0.1 · batch mean
 * assert.ok(Math.abs(m0 - 0.2) < 1e-6, `running mean ${m0}`);
 * assert.ok(Math.abs(m1 - 2) < 1e-6, `running mean ${m1}`);
 * assert.equal(y.size, z.size);
 * gpu.destroy();
 * ```
 */
export function batchNorm(x0: Tensor, options: BatchNormOptions): Tensor {
  // On the f32 list by default: under autocast a half input is read as it is
  // and y written in f32 (the kernels compute in f32), as if it were cast up.
  const { inputs: [x], widened } = autocastInputsWidenedInKernel("batch_norm", [x0]);
  const { runningMean, runningVar } = options;
  const weight = options.weight ?? null, bias = options.bias ?? null;
  const view = viewOf(x);
  const { training } = options;
  const momentum = options.momentum === undefined ? 0.1 : options.momentum;
  const eps = options.eps ?? 1e-5;
  // A checkpointed recompute must not move the statistics a second time.
  const update = training && (options.updateRunningStats ?? true) && !isRecomputing();
  checkVector("weight", weight, x, view.c);
  checkVector("bias", bias, x, view.c);
  checkVector("runningMean", runningMean, x, view.c);
  checkVector("runningVar", runningVar, x, view.c);
  checkOptions(x, view, training, options);
  if (update && isGradEnabled() && (runningMean.requiresGrad || runningVar.requiresGrad)) {
    throw new StateError(
      "batchNorm: runningMean and runningVar are updated in place and must not require grad " +
        `(got ${runningMean.describe()} requiresGrad ${runningMean.requiresGrad}, ` +
        `${runningVar.describe()} requiresGrad ${runningVar.requiresGrad}).`,
    );
  }
  const numBatchesTracked = options.numBatchesTracked ??
    (update && momentum === null ? implicitCounter(runningMean) : null);
  const tensors = { weight, bias, runningMean, runningVar, numBatchesTracked };
  const out = widened ? "f32" : x.dtype;
  const launched = launchBatchNorm(x, view, tensors, { training, update, momentum, eps, out });
  const [y, mean, rstd] = [launched.y, launched.mean, launched.rstd].map(Tensor.adopt);
  const inputs = [x, ...(weight ? [weight] : []), ...(bias ? [bias] : [])];
  const saved = [x, mean, rstd, ...(weight ? [weight] : [])];
  try {
    return record({
      op: "batch_norm",
      inputs,
      output: y,
      save: saved,
      backward: (g, [sx, sMean, sRstd, sWeight]) => {
        const { dx, dw, db } = launchBatchNormBackward(
          sx,
          view,
          { g, mean: sMean, rstd: sRstd, weight: sWeight ?? null },
          { training, bias: bias !== null },
        );
        const grads = [dx, ...(weight ? [dw] : []), ...(bias ? [db] : [])];
        return grads.map((t) => t && Tensor.adopt(t));
      },
    });
  } finally {
    // record() holds its own shared handles; ours go now (see layer_norm.ts).
    mean.dispose();
    rstd.dispose();
  }
}
