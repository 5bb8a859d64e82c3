import assert from "node:assert/strict";
import {
  logSoftmax,
  max,
  mean,
  mul,
  noGrad,
  softmax,
  sum,
  Tensor,
  tidy,
} from "../../../gpu/mod.ts";
import { GPU_TEST, withEachRowLayout } from "../../helpers/gpu.ts";
import { gradcheck } from "../../helpers/gradcheck.ts";
import { quantize, reduceMax64, reduceSum64, uniform } from "../../helpers/reference.ts";
import { checkSoftmaxCase } from "../../helpers/softmax_case.ts";
import { assertClose, TOL } from "../../helpers/assert.ts";

const CASES: { shape: number[]; axis?: number }[] = [
  { shape: [1] },
  { shape: [70001] }, // one long sum
  { shape: [2, 300001], axis: 1 }, // longer than one chunk: two stages
  { shape: [600001, 2], axis: 0 }, // the same down a strided axis
  { shape: [7, 129], axis: 1 },
  { shape: [7, 129], axis: 0 },
  { shape: [3, 33, 5], axis: 1 },
  { shape: [3, 33, 5], axis: -1 },
  { shape: [2, 4096], axis: -1 },
];

function view(shape: number[], axis?: number) {
  if (axis === undefined) return { outer: 1, axis: shape.reduce((a, b) => a * b), inner: 1 };
  const a = axis < 0 ? axis + shape.length : axis;
  const prod = (s: number[]) => s.reduce((x, y) => x * y, 1);
  return { outer: prod(shape.slice(0, a)), axis: shape[a], inner: prod(shape.slice(a + 1)) };
}

Deno.test({
  name: "sum, mean, max: forward and gradients match f64 along every axis, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    await withEachRowLayout(async () => {
      for (const { shape, axis } of CASES) {
        for (const dtype of ["f32", "f16", "bf16"] as const) {
          const n = shape.reduce((a, b) => a * b);
          const x = quantize(uniform(n, n), dtype);
          const v = view(shape, axis);
          const label = `${dtype} [${shape}] axis ${axis}`;
          // Sums of n terms of size ≤ 1 in f16 output: relative rounding of the result plus
          // f32 accumulation over up to 600001 terms.
          // bf16 output: its half-ulp is 2⁻⁸ ≈ 3.9e-3 relative.
          const tol = dtype === "f16"
            ? { atol: 5e-3, rtol: 2e-3 }
            : dtype === "bf16"
            ? { atol: 2e-2, rtol: 8e-3 }
            : { atol: 1e-4, rtol: 1e-4 };
          for (const op of ["sum", "mean"] as const) {
            const tx = Tensor.from(x, shape, { dtype, requiresGrad: true });
            const y = (op === "sum" ? sum : mean)(tx, { axis });
            const s = op === "mean" ? 1 / v.axis : 1;
            assertClose(await y.read(), reduceSum64(x, v, s), tol, `${op} ${label}`);
            const g = quantize(uniform(y.size, 3), dtype);
            y.backward({ gradient: Tensor.from(g, y.shape, { dtype }) });
            const expected = new Float64Array(n);
            for (let o = 0; o < v.outer; o++) {
              for (let a = 0; a < v.axis; a++) {
                for (let i = 0; i < v.inner; i++) {
                  expected[(o * v.axis + a) * v.inner + i] = g[o * v.inner + i] * s;
                }
              }
            }
            assertClose(await tx.grad!.read(), expected, TOL[dtype], `${op} grad ${label}`);
            tx.grad!.dispose();
            tx.dispose();
          }
          const tx = Tensor.from(x, shape, { dtype });
          assertClose(
            await max(tx, { axis }).read(),
            reduceMax64(x, v),
            { atol: 0, rtol: 0 },
            `max ${label}`,
          );
        }
      }
    });
  },
});

Deno.test({
  name: "sum: keepDims keeps the reduced axis; max refuses to record a gradient",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const x = Tensor.zeros([2, 3, 4], { requiresGrad: true });
      assert.deepEqual(sum(x, { axis: 1, keepDims: true }).shape, [2, 1, 4]);
      assert.deepEqual(sum(x).shape, []);
      assert.deepEqual(mean(x, { keepDims: true }).shape, [1, 1, 1]);
      assert.throws(() => max(x), /max: input f32 \[2, 3, 4\] requires grad/);
      assert.deepEqual(noGrad(() => max(x, { axis: -1 })).shape, [2, 3]);
      assert.throws(
        () => sum(x, { axis: 3 }),
        /sum: axis 3 is out of range for a tensor of rank 3/,
      );
    });
  },
});

Deno.test({
  name:
    "softmax and log-softmax: forward and backward match f64, f32, f16 and bf16, odd row lengths",
  ...GPU_TEST,
  async fn() {
    await withEachRowLayout(async () => {
      for (const [rows, cols] of [[1, 1], [5, 7], [3, 129], [2, 4099], [300, 10]]) {
        for (const dtype of ["f32", "f16", "bf16"] as const) {
          for (const log of [false, true]) {
            const where = `${dtype} [${rows}, ${cols}]`;
            await checkSoftmaxCase(rows, cols, dtype, { log, seed: cols, where });
          }
        }
      }
    });
  },
});

Deno.test({
  name: "softmax, log-softmax, sum and mean: gradients agree with finite differences",
  ...GPU_TEST,
  async fn() {
    const w = Tensor.from(uniform(4 * 9, 1), [4, 9]);
    await gradcheck("softmax", ([x]) => sum(mul(softmax(x), w)), [uniform(36, 2, -2, 2)], [[4, 9]]);
    await gradcheck("logSoftmax", ([x]) => sum(mul(logSoftmax(x), w)), [uniform(36, 3, -2, 2)], [[
      4,
      9,
    ]]);
    const w2 = Tensor.from(uniform(9, 4), [9]);
    await gradcheck("mean axis 0", ([x]) => sum(mul(mean(x, { axis: 0 }), w2)), [uniform(36, 5)], [[
      4,
      9,
    ]]);
  },
});

Deno.test({
  name: "softmax: only the last axis, with a clear error otherwise",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      assert.throws(
        () => softmax(Tensor.zeros([2, 3]), 0),
        /softmax: only the last axis is supported \(got axis 0 for f32 \[2, 3\]\)/,
      );
    });
  },
});

Deno.test({
  name: "sum, mean, max over 5M elements count every element (lavapipe stops long loops)",
  ...GPU_TEST,
  async fn() {
    const n = 5_000_003;
    const x = Tensor.full([n], 0.5);
    assert.equal(await sum(x).item(), n / 2); // exact: halves up to 2^24 are f32 integers
    const ramp = Tensor.from(Float32Array.from({ length: n }, (_, i) => (i === n - 2 ? 7 : 1)), [
      n,
    ]);
    assert.equal(await noGrad(() => max(ramp)).item(), 7, "the maximum sits near the end");
    assert.equal(await mean(x).item(), 0.5);
    for (const t of [x, ramp]) t.dispose();
  },
});
