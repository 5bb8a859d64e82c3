import assert from "node:assert/strict";
import { backward, narrow, split, Tensor, tidy } from "../../../mod.ts";
import { GPU_TEST } from "../../helpers/gpu.ts";
import { quantize, uniform } from "../../helpers/reference.ts";

/** Row-major window of `x` (shape) along `axis`, and its gradient placement, in plain loops. */
function window64(
  x: ArrayLike<number>,
  shape: number[],
  axis: number,
  start: number,
  length: number,
) {
  const outer = shape.slice(0, axis).reduce((a, b) => a * b, 1);
  const inner = shape.slice(axis + 1).reduce((a, b) => a * b, 1);
  const out: number[] = [];
  for (let o = 0; o < outer; o++) {
    for (let a = start; a < start + length; a++) {
      for (let i = 0; i < inner; i++) out.push(x[(o * shape[axis] + a) * inner + i]);
    }
  }
  return out;
}

Deno.test({
  name: "narrow and split: windows and gradients along every axis, f32, f16 and bf16 (odd offsets)",
  ...GPU_TEST,
  async fn() {
    const cases = [
      { shape: [7], axis: 0, start: 2, length: 4 },
      { shape: [3, 5], axis: -1, start: 0, length: 5 },
      { shape: [3, 5], axis: 0, start: 1, length: 1 },
      { shape: [2, 3, 9], axis: 2, start: 3, length: 3 },
      { shape: [2, 33, 4], axis: 1, start: 17, length: 16 },
      { shape: [2, 3, 4], axis: 1, start: 3, length: 0 },
    ];
    for (const { shape, axis, start, length } of cases) {
      for (const dtype of ["f32", "f16", "bf16"] as const) {
        const n = shape.reduce((a, b) => a * b, 1), a = axis < 0 ? axis + shape.length : axis;
        const xs = quantize(uniform(n, n + start, -3, 3), dtype);
        const x = Tensor.from(xs, shape, { dtype, requiresGrad: true });
        const y = narrow(x, axis, start, length);
        const label = `${dtype} ${shape} axis ${axis} [${start}, +${length})`;
        assert.deepEqual(y.shape, shape.map((e, i) => (i === a ? length : e)), label);
        assert.deepEqual([...(await y.read())], window64(xs, shape, a, start, length), label);
        // The gradient places g in the window: narrowing it back gives g, the rest is 0.
        const gs = quantize(uniform(y.size, 7, -1, 1), dtype);
        backward(y, { gradient: Tensor.from(gs, y.shape, { dtype }) });
        const dx = await x.grad!.read();
        const marked = window64(Array.from({ length: n }, (_, i) => i), shape, a, start, length);
        const expected = new Array<number>(n).fill(0);
        marked.forEach((index, k) => (expected[index] = gs[k]));
        assert.deepEqual([...dx], expected, `${label} gradient`);
        x.dispose();
        y.dispose();
      }
    }
    tidy(() => {
      const qkv = Tensor.from(uniform(2 * 3 * 12, 5), [2, 3, 12]);
      const parts = split(qkv, [4, 4, 4], -1);
      assert.deepEqual(parts.map((p) => p.shape.join()), ["2,3,4", "2,3,4", "2,3,4"]);
      assert.throws(
        () => split(qkv, [4, 4, 3], -1),
        /split: sizes \[4, 4, 3\] must be integers ≥ 0 adding up to 12/,
      );
      assert.throws(
        () => narrow(qkv, 1, 2, 2),
        /narrow: the window start 2, length 2 does not fit axis 1 \(of extent 3\)/,
      );
      assert.throws(
        () => narrow(qkv, 3, 0, 1),
        /narrow: axis 3 is out of range for a tensor of rank 3/,
      );
    });
  },
});
