import assert from "node:assert/strict";
import { mul, permute, reshape, sum, Tensor, tidy } from "../../../mod.ts";
import { GPU_TEST } from "../../helpers/gpu.ts";
import { gradcheck } from "../../helpers/gradcheck.ts";
import { quantize, uniform } from "../../helpers/reference.ts";
import { permute64 } from "../../helpers/attention_reference.ts";

const CASES: { shape: number[]; order: number[] }[] = [
  { shape: [7], order: [0] }, // identity: a free view
  { shape: [1, 1], order: [1, 0] },
  { shape: [5, 67], order: [1, 0] },
  { shape: [2, 3, 5], order: [2, 0, 1] },
  { shape: [3, 9, 4, 5], order: [0, 2, 1, 3] }, // attention: [B, T, H, D] → [B, H, T, D]
  { shape: [3, 9, 4, 5], order: [3, 1, 0, 2] },
  { shape: [2, 3, 4, 5], order: [-1, -2, -3, -4] }, // negative axes: a full reversal
  { shape: [33, 1, 17, 3], order: [1, 3, 0, 2] },
];

const invert = (order: number[]) => {
  const r = order.map((a) => (a < 0 ? a + order.length : a));
  const inv = new Array<number>(r.length);
  r.forEach((a, k) => (inv[a] = k));
  return inv;
};

Deno.test({
  name: "permute: values, shape and gradient match f64 exactly, f32, f16, bf16 and i32",
  ...GPU_TEST,
  async fn() {
    for (const { shape, order } of CASES) {
      const n = shape.reduce((a, b) => a * b);
      const resolved = order.map((a) => (a < 0 ? a + shape.length : a));
      const outShape = resolved.map((a) => shape[a]);
      for (const dtype of ["f32", "f16", "bf16", "i32"] as const) {
        const label = `${dtype} [${shape}] order [${order}]`;
        const x = dtype === "i32"
          ? Float64Array.from({ length: n }, (_, i) => i * 7 - 100)
          : quantize(uniform(n, n), dtype);
        const tx = Tensor.from(x, shape, { dtype, requiresGrad: dtype !== "i32" });
        const y = permute(tx, order);
        assert.deepEqual(y.shape, outShape, label);
        assert.equal(y.dtype, dtype);
        // A permutation copies values: no rounding anywhere, so no tolerance.
        assert.deepEqual([...await y.read()], [...permute64(x, shape, resolved)], label);
        if (dtype !== "i32") {
          const g = quantize(uniform(n, 3), dtype);
          y.backward({ gradient: Tensor.from(g, outShape, { dtype }) });
          const expected = permute64(g, outShape, invert(order));
          assert.deepEqual([...await tx.grad!.read()], [...expected], `${label} grad`);
          tx.grad!.dispose();
        }
        tx.dispose();
        y.dispose();
      }
    }
  },
});

Deno.test({
  name: "permute: the inverse order restores the input; the head split round-trips",
  ...GPU_TEST,
  async fn() {
    const [b, t, h, d] = [2, 5, 3, 4];
    const x = uniform(b * t * h * d, 11);
    const restored = tidy(() => {
      const q = Tensor.from(x, [b, t, h * d]);
      const heads = reshape(permute(reshape(q, [b, t, h, d]), [0, 2, 1, 3]), [b * h, t, d]);
      return reshape(permute(reshape(heads, [b, h, t, d]), [0, 2, 1, 3]), [b, t, h * d]);
    });
    assert.deepEqual([...await restored.read()], [...Float32Array.from(x)]);
    restored.dispose();
  },
});

Deno.test({
  name: "permute: gradients agree with finite differences",
  ...GPU_TEST,
  async fn() {
    const w = Tensor.from(uniform(60, 1), [5, 4, 3]);
    await gradcheck(
      "permute",
      ([x]) => sum(mul(permute(x, [2, 0, 1]), w)),
      [uniform(60, 2)],
      [[4, 3, 5]],
    );
    w.dispose();
  },
});

Deno.test({
  name: "permute: rank above 4 and orders that are not permutations are clear errors",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      assert.throws(
        () => permute(Tensor.zeros([1, 2, 1, 2, 1]), [0, 1, 2, 3, 4]),
        /permute: f32 \[1, 2, 1, 2, 1\] has rank 5; at most 4 axes are supported/,
      );
      const x = Tensor.zeros([2, 3, 4]);
      for (const bad of [[0, 1], [0, 1, 1], [0, 1, 3], [0, 1, 2, 3], [0, 1.5, 2], [-4, 1, 2]]) {
        assert.throws(
          () => permute(x, bad),
          /permute: order .* is not a permutation of the 3 axes of f32 \[2, 3, 4\]/,
          `order [${bad}]`,
        );
      }
    });
  },
});
