/** Differentiable causal softmax for attention scores [..., T, T] (f32 math inside). */
import { DTypeError, ShapeError, ValueError } from "../base/errors.ts";
import { record } from "../tensor/autograd.ts";
import { autocastInputs } from "../tensor/autocast_hook.ts";
import {
  launchCausalSoftmax,
  launchCausalSoftmaxBackward,
} from "../kernels/rows/causal_softmax.ts";
import { Tensor } from "../tensor/tensor.ts";

/** Options of {@link causalSoftmax}. */
export interface CausalSoftmaxOptions {
  /** Multiplies the scores before the softmax, fused in the kernel (default 1; attention uses 1/√d). */
  scale?: number;
}

/**
 * Softmax of `scale`·x over the last axis with a causal mask: `x` is [..., T, T]
 * and row i of every T×T matrix sees only columns j ≤ i. Masked entries come
 * out as exactly 0 (and get gradient 0); they are never read, so they need
 * not be filled with −∞. The max, the sum of exponentials and the backward
 * dot product are f32; the output has x's dtype.
 *
 * Under autocast the op is named `"causal_softmax"`, which is on no default
 * list: f16 (or bf16) scores stay so (f32 math inside, as LayerNorm does), which keeps
 * the saved [..., T, T] probabilities at half the bytes. Put it on the deny
 * list (`customAutocastLists({ deny: ["causal_softmax"] })`) for f32 output.
 *
 * Saved for backward: the output y (the rule is dx = s·y·(dy − Σ dy·y)).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { causalSoftmax, initGpu, matmul, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const d = 2;
 * const q = Tensor.from([1, 0, 0, 1], [1, 2, d]), k = q; // [B·H, T, D]
 * const scores = matmul(q, k, { transB: true }); // [B·H, T, T]
 * const probs = causalSoftmax(scores, { scale: 1 / Math.sqrt(d) }); // row i: columns 0..i
 * const [p00, p01] = await probs.read();
 * assert.equal(p00, 1);
 * assert.equal(p01, 0);
 * gpu.destroy();
 * ```
 */
export function causalSoftmax(x0: Tensor, options: CausalSoftmaxOptions = {}): Tensor {
  const [x] = autocastInputs("causal_softmax", [x0]);
  const scale = options.scale ?? 1;
  if (x.dtype === "i32") {
    throw new DTypeError(
      `causalSoftmax: needs float scores (f32, f16 or bf16), got ${x.describe()}.`,
    );
  }
  if (x.rank < 2 || x.shape.at(-1) !== x.shape.at(-2)) {
    throw new ShapeError(
      `causalSoftmax: scores ${x.describe()} must be [..., T, T] (square in the last two axes); ` +
        "compute them as matmul(q, k, { transB: true }) with q and k both [batch, T, d].",
    );
  }
  if (!Number.isFinite(scale)) {
    throw new ValueError(`causalSoftmax: scale must be a finite number, got ${scale}.`);
  }
  const y = Tensor.adopt(launchCausalSoftmax(x, scale));
  return record({
    op: "causal_softmax",
    inputs: [x],
    output: y,
    save: [y],
    backward: (g, [sy]) => [Tensor.adopt(launchCausalSoftmaxBackward(sy, g, scale))],
  });
}
