/** Differentiable axis permutation (a contiguous copy), for tensors of rank ≤ 4. */
import { ShapeError } from "../base/errors.ts";
import { record } from "../tensor/autograd.ts";
import { launchPermute, PERMUTE_MAX_RANK } from "../kernels/permute.ts";
import { shapeString } from "../base/shape.ts";
import { Tensor } from "../tensor/tensor.ts";

/** `order` with negative axes resolved, or a clear error when it is not a permutation of x's axes. */
function resolveOrder(x: Tensor, order: readonly number[]): number[] {
  const rank = x.rank;
  if (rank > PERMUTE_MAX_RANK) {
    throw new ShapeError(
      `permute: ${x.describe()} has rank ${rank}; at most ${PERMUTE_MAX_RANK} axes are supported. ` +
        "Merge neighbouring axes that stay together with reshape() first.",
    );
  }
  const resolved = order.map((a) => (Number.isInteger(a) && a < 0 ? a + rank : a));
  const seen = new Set(resolved);
  if (
    order.length !== rank || seen.size !== rank ||
    resolved.some((a) => !Number.isInteger(a) || a < 0 || a >= rank)
  ) {
    throw new ShapeError(
      `permute: order ${shapeString(order)} is not a permutation of the ${rank} axes of ` +
        `${x.describe()}; give each axis 0..${rank - 1} exactly once.`,
    );
  }
  return resolved;
}

/**
 * A contiguous copy of `x` with its axes reordered: output axis k is input
 * axis `order[k]` (negative axes count from the end), so the output shape is
 * `order.map((a) => x.shape[a])`. Any dtype, rank ≤ 4. The identity order
 * returns a free view, as `reshape` does. The gradient is the gradient
 * permuted back by the inverse order; nothing is saved for backward.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, permute, reshape, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const [b, t, h, d] = [1, 2, 2, 1];
 * const q = Tensor.from([1, 2, 3, 4], [b, t, h * d]);
 * const heads = permute(reshape(q, [b, t, h, d]), [0, 2, 1, 3]); // [B, H, T, D]
 * assert.equal((await heads.read()).join(), "1,3,2,4");
 * gpu.destroy();
 * ```
 */
export function permute(x: Tensor, order: readonly number[]): Tensor {
  // A permutation moves values and never changes their dtype: it does not
  // consult autocast (see the op registry).
  const resolved = resolveOrder(x, order);
  const identity = resolved.every((a, k) => a === k);
  const y = identity ? x.share() : Tensor.adopt(launchPermute(x, resolved));
  const inverse = new Array<number>(resolved.length);
  resolved.forEach((a, k) => (inverse[a] = k));
  return record({
    op: "permute",
    inputs: [x],
    output: y,
    backward: (g) => [identity ? g.share() : Tensor.adopt(launchPermute(g, inverse))],
  });
}
