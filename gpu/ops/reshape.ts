/** Reshape: a new handle to the same GPU memory with another shape (no copy). */
import { ShapeError } from "../base/errors.ts";
import { record } from "../tensor/autograd.ts";
import { assertValidShape, type Shape, shapeString, sizeOf } from "../base/shape.ts";
import type { Tensor } from "../tensor/tensor.ts";
import { assertTensors } from "./checks.ts";

/**
 * The same data viewed with another shape of equal size; one extent may be
 * -1 and is inferred.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, reshape, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const images = Tensor.zeros([2, 28, 28]);
 * const flat = reshape(images, [-1, 784]); // the same memory, no copy
 * assert.equal(flat.shape.join(), "2,784");
 * assert.ok(flat.sharesMemoryWith(images));
 * gpu.destroy();
 * ```
 */
export function reshape(x: Tensor, shape: Shape): Tensor {
  assertTensors("reshape", x);
  if (!Array.isArray(shape)) assertValidShape("reshape", shape); // throws: not an array
  const known = shape.filter((d) => d !== -1);
  const inferred = shape.length - known.length;
  const resolved = inferred === 1 && sizeOf(known) > 0
    ? shape.map((d) => (d === -1 ? x.size / sizeOf(known) : d))
    : shape;
  assertValidShape("reshape", resolved);
  if (inferred > 1 || sizeOf(resolved) !== x.size) {
    throw new ShapeError(
      `reshape: cannot view ${x.describe()} (${x.size} elements) as ${shapeString(shape)}.`,
    );
  }
  const y = x.share(resolved);
  return record({ op: "reshape", inputs: [x], output: y, backward: (g) => [g.share(x.shape)] });
}
