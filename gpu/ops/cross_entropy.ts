/** Differentiable per-row cross-entropy from logits (f32 math inside). */
import { ShapeError, ValueError } from "../errors.ts";
import { record } from "../autograd.ts";
import { autocastInputs } from "../autocast_hook.ts";
import { launchCrossEntropy, launchCrossEntropyBackward } from "../kernels/cross_entropy.ts";
import type { Tensor } from "../tensor.ts";
import { assertIdsInRange } from "./embedding.ts";

/**
 * The cross-entropy of each row of `logits` ([rows, classes], f32 or f16)
 * against i32 class ids `targets` ([rows]), as f32 losses [rows]; `smoothing`
 * is the label-smoothing ε in [0, 1). The log-sum-exp is computed stably in
 * f32, and the backward needs no softmax kept in memory.
 */
export function crossEntropyPerRow(logits0: Tensor, targets: Tensor, smoothing = 0): Tensor {
  const [logits] = autocastInputs("cross_entropy", [logits0]);
  if (
    logits.rank !== 2 || targets.dtype !== "i32" || targets.rank !== 1 ||
    targets.shape[0] !== logits.shape[0]
  ) {
    throw new ShapeError(
      `crossEntropy: needs logits [rows, classes] and i32 targets [rows]; got logits ` +
        `${logits.describe()} and targets ${targets.describe()}.`,
    );
  }
  if (!(smoothing >= 0 && smoothing < 1)) {
    throw new ValueError(`crossEntropy: label smoothing must be in [0, 1), got ${smoothing}.`);
  }
  assertIdsInRange("crossEntropy", targets, logits.shape[1]);
  const { loss, lse } = launchCrossEntropy(logits, targets, smoothing);
  record({
    op: "cross_entropy",
    inputs: [logits],
    output: loss,
    save: [logits, targets, lse],
    backward: (g, [x, t, l]) => [launchCrossEntropyBackward(x, t, l, g, smoothing)],
  });
  lse.dispose(); // the tape holds its own handle when it needs one
  return loss;
}
