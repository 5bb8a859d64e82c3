/**
 * Slicing along one axis: `narrow` (one window) and `split` (consecutive
 * windows), and its inverse, `concat`.
 */
import { record } from "../tensor/autograd.ts";
import { fail, ShapeError } from "../base/errors.ts";
import {
  launchConcat,
  launchNarrow,
  launchNarrowBackward,
  type NarrowWindow,
} from "../kernels/narrow.ts";
import { normalizeAxis, shapeString } from "../base/shape.ts";
import { shortValue } from "../base/short_text.ts";
import { Tensor } from "../tensor/tensor.ts";

/**
 * Indices `start .. start + length` of `x` along `axis` (negative counts from
 * the end), as a new contiguous tensor: PyTorch's `x.narrow(axis, start,
 * length)`, except that the result is a copy, not a view. Its gradient is the
 * upstream gradient placed in that window of a zero tensor of x's shape.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, narrow, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2, 3, 4, 5, 6], [2, 3]);
 * const y = narrow(x, -1, 1, 2); // columns 1 and 2 of each row
 * assert.equal((await y.read()).join(), "2,3,5,6");
 * gpu.destroy();
 * ```
 */
export function narrow(x: Tensor, axis: number, start: number, length: number): Tensor {
  const a = normalizeAxis("narrow", axis, x.rank);
  const extent = x.shape[a];
  const whole = (n: number) => Number.isInteger(n) && n >= 0;
  if (!whole(start) || !whole(length) || start + length > extent) {
    fail(
      ShapeError,
      "narrow",
      `the window start ${start}, length ${length} does not fit axis ${axis} (of extent ` +
        `${extent}) of ${x.describe()}; start and length must be integers ≥ 0 with ` +
        "start + length ≤ extent.",
    );
  }
  const window = { axis: a, start, length };
  const shape = x.shape;
  return record({
    op: "narrow",
    inputs: [x],
    output: Tensor.adopt(launchNarrow(x, window)),
    backward: (g) => [Tensor.adopt(launchNarrowBackward(g, shape, window))],
  });
}

/**
 * `x` cut along `axis` into consecutive pieces of the given `sizes` (they
 * must add up to the axis's extent), as PyTorch's `torch.split(x, sizes,
 * dim)` with a list: e.g. a fused projection's [B, T, 3C] output into q, k
 * and v. Each piece is a copy (see {@link narrow}).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, split, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const qkv = Tensor.from([1, 2, 3, 4, 5, 6], [1, 1, 6]); // [B, T, 3C] with C = 2
 * const [q, k, v] = split(qkv, [2, 2, 2], -1);
 * assert.equal((await k.read()).join(), "3,4");
 * assert.equal(v.shape.join(), "1,1,2");
 * gpu.destroy();
 * ```
 */
export function split(x: Tensor, sizes: readonly number[], axis = 0): Tensor[] {
  const a = normalizeAxis("split", axis, x.rank);
  const total = Array.isArray(sizes) ? sizes.reduce((s, n) => s + n, 0) : NaN;
  if (
    !Array.isArray(sizes) || !sizes.every((n) => Number.isInteger(n) && n >= 0) ||
    total !== x.shape[a]
  ) {
    fail(
      ShapeError,
      "split",
      `sizes ${
        Array.isArray(sizes) ? shapeString(sizes) : shortValue(sizes)
      } must be integers ≥ 0 adding up to ${x.shape[a]}, the extent ` +
        `of axis ${axis} of ${x.describe()}.`,
    );
  }
  let start = 0;
  return sizes.map((n) => {
    const piece = narrow(x, a, start, n);
    start += n;
    return piece;
  });
}

/**
 * `tensors` joined along `axis` (PyTorch's `torch.cat`): they share a dtype
 * and every extent but that axis's. Each one's gradient is its window of the
 * upstream gradient. bf16 pieces must start and end on even element offsets
 * (two share a word).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { concat, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const a = Tensor.from([1, 2, 3, 4], [2, 2]), b = Tensor.from([5, 6], [2, 1]);
 * const y = concat([a, b], -1); // [2, 3]
 * assert.deepEqual([...await y.read()], [1, 2, 5, 3, 4, 6]);
 * gpu.destroy();
 * ```
 */
export function concat(tensors: readonly Tensor[], axis = 0): Tensor {
  if (!(tensors?.length > 0)) {
    fail(ShapeError, "concat", "needs a non-empty array of tensors.");
  }
  const first: Tensor = tensors[0];
  const a = normalizeAxis("concat", axis, first.rank);
  const fits = tensors.every((t) =>
    t.rank === first.rank && t.dtype === first.dtype &&
    t.shape.every((e, i) => i === a || e === first.shape[i])
  );
  if (!fits) {
    fail(
      ShapeError,
      "concat",
      `the tensors must share a dtype and every extent but axis ${axis}'s; got ` +
        `${tensors.map((t) => t.describe()).join(", ")}.`,
    );
  }
  const out = Tensor.adopt(launchConcat(tensors, a));
  const windows: NarrowWindow[] = [];
  let start = 0;
  for (const t of tensors) {
    windows.push({ axis: a, start, length: t.shape[a] });
    start += t.shape[a];
  }
  return record({
    op: "concat",
    inputs: [...tensors],
    output: out,
    backward: (g) => windows.map((w) => Tensor.adopt(launchNarrow(g, w))),
  });
}
