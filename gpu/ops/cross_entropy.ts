/** Differentiable per-row cross-entropy from logits (f32 math inside). */
import { DTypeError, fail, ShapeError, ValueError } from "../base/errors.ts";
import { record } from "../tensor/autograd.ts";
import { autocastInputsWidenedInKernel } from "../tensor/autocast_hook.ts";
import {
  type CrossEntropyParams,
  launchCrossEntropy,
  launchCrossEntropyBackward,
} from "../kernels/rows/cross_entropy.ts";
import { Tensor } from "../tensor/tensor.ts";
import { assertIdsInRange } from "./ids_check.ts";

/** Options of {@link crossEntropyPerRow}; each as in `torch.nn.functional.cross_entropy`. */
export interface CrossEntropyRowOptions {
  /** Per-class weights, an f32 tensor [classes] (PyTorch's `weight`); default all 1. */
  weight?: Tensor;
  /** Rows whose target is this id add nothing (PyTorch's `ignore_index`, default −100). */
  ignoreIndex?: number;
  /** Label smoothing ε in [0, 1] (PyTorch's `label_smoothing`, default 0). */
  smoothing?: number;
}

/** Per-row results of {@link crossEntropyPerRow}, both f32 [rows]. */
export interface CrossEntropyPerRow {
  /** Each row's loss (0 for ignored rows); differentiable. */
  losses: Tensor;
  /**
   * Each row's target weight w[target] (1 without weights, 0 for ignored
   * rows): their sum divides the "mean" reduction, as in PyTorch. Constant.
   */
  targetWeights: Tensor;
}

function checkedParams(
  logits: Tensor,
  targets: Tensor,
  options: CrossEntropyRowOptions,
): CrossEntropyParams {
  const where = "crossEntropy";
  if (
    logits.rank !== 2 || targets.dtype !== "i32" || targets.rank !== 1 ||
    targets.shape[0] !== logits.shape[0]
  ) {
    fail(
      ShapeError,
      where,
      `needs logits [rows, classes] and i32 targets [rows]; got logits ${logits.describe()} ` +
        `and targets ${targets.describe()}.`,
    );
  }
  if (logits.dtype === "i32") {
    fail(DTypeError, where, `logits ${logits.describe()} must be f32, f16 or bf16.`);
  }
  const classes = logits.shape[1];
  const smoothing = options.smoothing ?? 0;
  if (!(smoothing >= 0 && smoothing <= 1)) {
    fail(ValueError, where, `label smoothing must be in [0, 1], got ${smoothing}.`);
  }
  const ignoreIndex = options.ignoreIndex ?? -100;
  if (!Number.isInteger(ignoreIndex) || Math.abs(ignoreIndex) >= 2 ** 31) {
    fail(ValueError, where, `ignoreIndex must be a 32-bit integer, got ${ignoreIndex}.`);
  }
  const weight = options.weight ?? null;
  if (weight && (weight.dtype !== "f32" || weight.rank !== 1 || weight.shape[0] !== classes)) {
    fail(
      ShapeError,
      where,
      `class weights must be f32 [${classes}] (one per class of logits ${logits.describe()}), ` +
        `got ${weight.describe()}.`,
    );
  }
  if (weight && weight.gpu !== logits.gpu) {
    fail(ValueError, where, "class weights live on another Gpu than the logits.");
  }
  assertIdsInRange(where, targets, classes, ignoreIndex);
  return { weight, ignoreIndex, smoothing };
}

/**
 * The cross-entropy of each row of `logits` ([rows, classes], f32, f16 or bf16)
 * against i32 class ids `targets` ([rows]), as f32 losses [rows], with
 * PyTorch's class weights, ignore index and label smoothing. The
 * log-sum-exp is computed stably in f32, and the backward needs no softmax
 * kept in memory. Gradients flow to the logits only.
 */
export function crossEntropyPerRow(
  logits0: Tensor,
  targets: Tensor,
  options: CrossEntropyRowOptions = {},
): CrossEntropyPerRow {
  // The kernels compute in f32 whatever the logits' dtype: f16 and bf16 logits are read, not cast
  // up, and their gradient is written in their dtype.
  const { inputs: [logits] } = autocastInputsWidenedInKernel("cross_entropy", [logits0]);
  const params = checkedParams(logits, targets, options);
  const launched = launchCrossEntropy(logits, targets, params);
  const [loss, targetWeight, stats] = [launched.loss, launched.targetWeight, launched.stats]
    .map(Tensor.adopt);
  // The tape keeps the class weights alive for the backward with the other saved tensors.
  // (The weights are the caller's tensor: adopt hands it back as it is.)
  const saved = params.weight
    ? [logits, targets, stats, Tensor.adopt(params.weight)]
    : [logits, targets, stats];
  record({
    op: "cross_entropy",
    inputs: [logits],
    output: loss,
    save: saved,
    backward: (g, [x, t, s, w]) => [
      Tensor.adopt(launchCrossEntropyBackward(x, t, s, g, { ...params, weight: w ?? null })),
    ],
  });
  stats.dispose(); // the tape holds its own handle when it needs one
  return { losses: loss, targetWeights: targetWeight };
}
