/** Differentiable softmax and log-softmax over the last axis (f32 math inside; f32, f16 or bf16 storage). */
import { DTypeError, fail, ShapeError } from "../base/errors.ts";
import { record } from "../tensor/autograd.ts";
import { autocastInputs } from "../tensor/autocast_hook.ts";
import { launchSoftmax, launchSoftmaxBackward, type SoftmaxKind } from "../kernels/rows/softmax.ts";
import { Tensor } from "../tensor/tensor.ts";
import { assertTensors } from "./checks.ts";

function checkAxis(op: string, x: Tensor, axis: number): void {
  if (axis !== -1 && axis !== x.rank - 1) {
    throw new ShapeError(
      `${op}: only the last axis is supported (got axis ${axis} for ${x.describe()}). ` +
        "Move the axis last first.",
    );
  }
}

function softmaxOp(kind: SoftmaxKind, x0: Tensor, axis: number): Tensor {
  const where = kind === "softmax" ? "softmax" : "logSoftmax";
  assertTensors(where, x0);
  const [x] = autocastInputs(kind, [x0]);
  checkAxis(kind, x, axis);
  if (x.dtype === "i32") fail(DTypeError, where, `input ${x.describe()} must be f32, f16 or bf16.`);
  const y = Tensor.adopt(launchSoftmax(kind, x));
  return record({
    op: kind,
    inputs: [x],
    output: y,
    save: [y],
    backward: (g, [sy]) => [Tensor.adopt(launchSoftmaxBackward(kind, sy, g))],
  });
}

/**
 * Softmax over the last axis: exp(x − max) / Σ exp(x − max), in f32.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, softmax, sum, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const logits = Tensor.from([1, 2, 3, 0, 0, 0], [2, 3]);
 * const probs = softmax(logits); // rows sum to 1
 * const rowSums = await sum(probs, { axis: -1 }).read();
 * assert.ok(rowSums.every((r) => Math.abs(r - 1) < 1e-6), `row sums ${rowSums}`);
 * gpu.destroy();
 * ```
 */
export function softmax(x: Tensor, axis = -1): Tensor {
  return softmaxOp("softmax", x, axis);
}

/** log(softmax(x)) over the last axis, computed stably as x − max − log Σ exp(x − max). */
export function logSoftmax(x: Tensor, axis = -1): Tensor {
  return softmaxOp("log_softmax", x, axis);
}
