/** Flatten: a run of axes merged into one, as a reshape (no copy). */
import { fail, ShapeError, ValueError } from "../base/errors.ts";
import { type Shape, sizeOf } from "../base/shape.ts";
import type { Tensor } from "../tensor/tensor.ts";
import { reshape } from "./reshape.ts";

/**
 * Checks that `startDim` and `endDim` are integers and, when both count
 * from the same end, in order (what {@link flatten} and the nn layer check
 * first, before any input is known). Throws a ValueError otherwise.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { ValueError } from "../base/errors.ts";
 * import { checkFlattenDims } from "./flatten.ts";
 * checkFlattenDims("Flatten", 1, -1); // fine: returns
 * assert.throws(() => checkFlattenDims("Flatten", 2, 1), ValueError); // out of order
 * assert.throws(() => checkFlattenDims("Flatten", 0.5, -1), ValueError); // not an axis
 * ```
 */
export function checkFlattenDims(where: string, startDim: number, endDim: number): void {
  const problems: string[] = [];
  for (const [name, v] of [["startDim", startDim], ["endDim", endDim]] as const) {
    if (!Number.isInteger(v)) {
      problems.push(`${name} must be an integer (an axis; negative counts from the end), got ${v}`);
    }
  }
  const sameSide = (startDim < 0) === (endDim < 0);
  if (problems.length === 0 && sameSide && startDim > endDim) {
    problems.push(`startDim ${startDim} comes after endDim ${endDim}; it must not`);
  }
  fail(ValueError, where, problems);
}

/**
 * Axes `startDim` … `endDim` (inclusive; negative counts from the end)
 * merged into one, as `torch.flatten(x, start_dim, end_dim)`: a view of the
 * same memory through {@link reshape}, so nothing is copied and the gradient
 * is reshaped back. The default `startDim` is 1, as `torch.nn.Flatten` (so
 * [N, C, H, W] becomes [N, C·H·W]); `torch.flatten` itself defaults to 0. A
 * scalar flattens to [1]; with `startDim` = `endDim` the shape is unchanged.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { flatten, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const images = Tensor.zeros([2, 3, 4, 5]); // [N, C, H, W]
 * const features = flatten(images); // [2, 60], the same memory
 * assert.equal(features.shape.join(), "2,60");
 * assert.ok(features.sharesMemoryWith(images));
 * assert.equal(flatten(images, 0, 1).shape.join(), "6,4,5");
 * gpu.destroy();
 * ```
 */
export function flatten(x: Tensor, startDim = 1, endDim = -1): Tensor {
  checkFlattenDims("flatten", startDim, endDim);
  // A scalar flattens as if it had one axis of size 1 (PyTorch's rule).
  const shape: Shape = x.rank === 0 ? [1] : x.shape;
  const rank = shape.length;
  const axis = (name: string, d: number) => {
    const a = d < 0 ? d + rank : d;
    if (a < 0 || a >= rank) {
      fail(
        ShapeError,
        "flatten",
        `${name} ${d} is out of range for input ${x.describe()}; ` +
          `use an axis in [${-rank}, ${rank - 1}].`,
      );
    }
    return a;
  };
  const start = axis("startDim", startDim), end = axis("endDim", endDim);
  if (start > end) {
    fail(
      ShapeError,
      "flatten",
      `startDim ${startDim} (axis ${start}) comes after endDim ${endDim} (axis ${end}) for ` +
        `input ${x.describe()}; startDim must not come after endDim.`,
    );
  }
  const merged = sizeOf(shape.slice(start, end + 1));
  return reshape(x, [...shape.slice(0, start), merged, ...shape.slice(end + 1)]);
}
