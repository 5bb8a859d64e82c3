import assert from "node:assert/strict";
import {
  add,
  addScalar,
  cast,
  div,
  exp,
  gelu,
  log,
  mul,
  neg,
  relu,
  scale,
  sqrt,
  square,
  sub,
  sum,
  Tensor,
  tidy,
} from "../../../gpu/mod.ts";
import { GPU_TEST, withEachElementwiseWidth } from "../../helpers/gpu.ts";
import { gradcheck } from "../../helpers/gradcheck.ts";
import {
  gelu64,
  geluExact64,
  geluExactGrad64,
  geluGrad64,
  quantize,
  uniform,
} from "../../helpers/reference.ts";
import { assertClose, TOL } from "../../helpers/assert.ts";

/** Each unary op with its f64 value and derivative, and the input range it is defined on. */
const UNARY = [
  { name: "neg", op: neg, f: (x: number) => -x, df: () => -1, lo: -2, hi: 2 },
  {
    name: "scale",
    op: (t: Tensor) => scale(t, -1.5),
    f: (x: number) => -1.5 * x,
    df: () => -1.5,
    lo: -2,
    hi: 2,
  },
  {
    name: "addScalar",
    op: (t: Tensor) => addScalar(t, 0.25),
    f: (x: number) => x + 0.25,
    df: () => 1,
    lo: -2,
    hi: 2,
  },
  { name: "exp", op: exp, f: Math.exp, df: Math.exp, lo: -3, hi: 3 },
  { name: "log", op: log, f: Math.log, df: (x: number) => 1 / x, lo: 0.2, hi: 4 },
  { name: "sqrt", op: sqrt, f: Math.sqrt, df: (x: number) => 0.5 / Math.sqrt(x), lo: 0.2, hi: 4 },
  { name: "square", op: square, f: (x: number) => x * x, df: (x: number) => 2 * x, lo: -2, hi: 2 },
  {
    name: "relu",
    op: relu,
    f: (x: number) => Math.max(x, 0),
    df: (x: number) => (x > 0 ? 1 : 0),
    lo: -2,
    hi: 2,
  },
  { name: "gelu", op: gelu, f: geluExact64, df: geluExactGrad64, lo: -6, hi: 6 },
  {
    name: "gelu tanh",
    op: (t: Tensor) => gelu(t, { approximate: "tanh" }),
    f: gelu64,
    df: geluGrad64,
    lo: -5,
    hi: 5,
  },
];

// 1, a size that is no multiple of the 1024-element workgroup span, and a large one.
/** Odd sizes for the scalar kernels; multiples of 4 (one not of 16) for the vec4 ones. */
const SIZES = { scalar: [1, 1031, 70001], vec4: [4, 1036, 70004] };

Deno.test({
  name:
    "unary ops: forward and backward match f64 in f32, f16 and bf16, on odd sizes, scalar and vec4",
  ...GPU_TEST,
  fn: () =>
    withEachElementwiseWidth(async (vec4) => {
      for (const u of UNARY) {
        for (const dtype of ["f32", "f16", "bf16"] as const) {
          for (const n of SIZES[vec4 ? "vec4" : "scalar"]) {
            const x = quantize(uniform(n, n, u.lo, u.hi), dtype);
            const g = quantize(uniform(n, n + 1), dtype);
            const tx = Tensor.from(x, [n], { dtype, requiresGrad: true });
            const y = u.op(tx);
            assert.equal(y.dtype, dtype);
            const label = `${u.name} ${dtype} n=${n}`;
            assertClose(await y.read(), x.map(u.f), TOL[dtype], `${label} forward`);
            y.backward({ gradient: Tensor.from(g, [n], { dtype }) });
            const expected = x.map((v, i) => g[i] * u.df(v));
            assertClose(await tx.grad!.read(), expected, TOL[dtype], `${label} backward`);
            tx.grad!.dispose();
            tx.dispose();
          }
        }
      }
    }),
});

Deno.test({
  name: "unary ops: gradients agree with finite differences",
  ...GPU_TEST,
  async fn() {
    for (const u of UNARY) {
      const w = Tensor.from(uniform(37, 5), [37]);
      // relu's kink: keep points away from 0 so a step of ε cannot cross it.
      const x = uniform(37, 6, u.lo, u.hi).map((
        v,
      ) => (u.name === "relu" && Math.abs(v) < 0.05 ? 0.5 : v));
      await gradcheck(u.name, ([t]) => sum(mul(u.op(t), w)), [x], [[37]], { eps: 1e-3 });
      w.dispose();
    }
  },
});

const BINARY = [
  { name: "add", op: add, f: (a: number, b: number) => a + b, da: () => 1, db: () => 1 },
  { name: "sub", op: sub, f: (a: number, b: number) => a - b, da: () => 1, db: () => -1 },
  {
    name: "mul",
    op: mul,
    f: (a: number, b: number) => a * b,
    da: (_: number, b: number) => b,
    db: (a: number) => a,
  },
  {
    name: "div",
    op: div,
    f: (a: number, b: number) => a / b,
    da: (_: number, b: number) => 1 / b,
    db: (a: number, b: number) => -a / (b * b),
  },
];

/** Shapes of a and of a b that broadcasts into it, with b's index for a's element i. */
const BROADCASTS = [
  { a: [7, 13], b: [7, 13], index: (i: number) => i },
  { a: [6, 14], b: [6, 14], index: (i: number) => i }, // a multiple of 4: vec4 where enabled
  { a: [7, 13], b: [13], index: (i: number) => i % 13 }, // bias over rows
  { a: [7, 13], b: [7, 1], index: (i: number) => Math.floor(i / 13) }, // per-row value
  { a: [7, 13], b: [1], index: () => 0 }, // scalar
  { a: [3, 5, 4], b: [3, 1, 4], index: (i: number) => Math.floor(i / 20) * 4 + (i % 4) }, // middle axis
  { a: [1, 7, 13], b: [7, 13], index: (i: number) => i }, // a batch of one: b lacks a leading 1
];

Deno.test({
  name:
    "binary ops with broadcasting: forward and both gradients match f64, f32, f16 and bf16, scalar and vec4",
  ...GPU_TEST,
  fn: () =>
    withEachElementwiseWidth(async () => {
      for (const op of BINARY) {
        for (const bc of BROADCASTS) {
          for (const dtype of ["f32", "f16", "bf16"] as const) {
            const na = bc.a.reduce((x, y) => x * y), nb = bc.b.reduce((x, y) => x * y);
            const a = quantize(uniform(na, 1), dtype);
            // Keep divisors away from zero.
            const b = quantize(uniform(nb, 2, 0.5, 2), dtype);
            const g = quantize(uniform(na, 3), dtype);
            const ta = Tensor.from(a, bc.a, { dtype, requiresGrad: true });
            const tb = Tensor.from(b, bc.b, { dtype, requiresGrad: true });
            const y = op.op(ta, tb);
            const label = `${op.name} ${dtype} [${bc.a}] with [${bc.b}]`;
            assertClose(
              await y.read(),
              a.map((v, i) => op.f(v, b[bc.index(i)])),
              TOL[dtype],
              label,
            );
            y.backward({ gradient: Tensor.from(g, bc.a, { dtype }) });
            const da = a.map((v, i) => g[i] * op.da(v, b[bc.index(i)]));
            const db = new Float64Array(nb);
            a.forEach((v, i) => (db[bc.index(i)] += g[i] * op.db(v, b[bc.index(i)])));
            // db sums up to 91 products; in f16 and bf16 its terms are rounded once each: loosen atol.
            const tolB = dtype === "f16"
              ? { atol: 2e-2, rtol: 5e-3 }
              : dtype === "bf16"
              ? { atol: 8e-2, rtol: 1.6e-2 }
              : TOL.f32;
            assertClose(await ta.grad!.read(), da, TOL[dtype], `${label} da`);
            assertClose(await tb.grad!.read(), db, tolB, `${label} db`);
            assert.deepEqual(tb.grad!.shape, bc.b, `${label}: db has b's shape`);
            [ta, tb, y].forEach((t) => {
              t.grad?.dispose();
              t.dispose();
            });
          }
        }
      }
    }),
});

Deno.test({
  name: "binary ops: finite differences through a broadcast divisor",
  ...GPU_TEST,
  async fn() {
    const w = Tensor.from(uniform(6 * 5, 4), [6, 5]);
    await gradcheck(
      "div by row",
      ([a, b]) => sum(mul(div(a, b), w)),
      [uniform(30, 1), uniform(6, 2, 0.5, 2)],
      [[6, 5], [6, 1]],
      { eps: 1e-3 },
    );
  },
});

Deno.test({
  name: "cast: f32 <-> f16 rounds like Float16Array and the gradient casts back, scalar and vec4",
  ...GPU_TEST,
  fn: () =>
    withEachElementwiseWidth(async () => {
      const x = uniform(1000, 9, -70000, 70000).map((v, i) => (i % 2 ? v / 1e4 : v / 100));
      const t = Tensor.from(x, [1000], { requiresGrad: true });
      const h = cast(t, "f16");
      assert.equal(h.dtype, "f16");
      // WebGPU's f32 -> f16 conversion rounds to nearest, like Float16Array.
      assertClose(
        await h.read(),
        Float64Array.from(Float16Array.from(x)),
        { atol: 0, rtol: 0 },
        "to f16",
      );
      const back = cast(h, "f32");
      assertClose(
        await back.read(),
        Float64Array.from(Float16Array.from(x)),
        { atol: 0, rtol: 0 },
        "to f32",
      );
      back.backward({ gradient: Tensor.full([1000], 0.5) });
      assert.equal(t.grad!.dtype, "f32");
      assertClose(
        await t.grad!.read(),
        new Float64Array(1000).fill(0.5),
        { atol: 0, rtol: 0 },
        "grad",
      );
    }),
});

Deno.test({
  name: "elementwise: mismatched shapes and dtypes are clear errors",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const a = Tensor.zeros([2, 3]);
      assert.throws(
        () => add(a, Tensor.zeros([4])),
        /add: cannot broadcast shape \[4\] to \[2, 3\]: axis 1 has 4 where 3 is needed/,
      );
      assert.throws(
        () => mul(a, Tensor.zeros([2, 3], { dtype: "f16" })),
        /mul: dtypes differ \(f32 \[2, 3\] and f16 \[2, 3\]\)/,
      );
      assert.throws(
        () => sub(Tensor.zeros([3]), a),
        /sub: cannot broadcast shape \[2, 3\] to \[3\]/,
      );
      assert.throws(
        () => add(Tensor.zeros([2, 3, 4]), Tensor.zeros([1, 3, 1])),
        /repeated axes must be adjacent/,
      );
    });
  },
});

Deno.test({
  name: "a tensor used three times accumulates its gradients, f32, f16 and bf16, scalar and vec4",
  ...GPU_TEST,
  fn: () =>
    withEachElementwiseWidth(async (vec4) => {
      for (const dtype of ["f32", "f16", "bf16"] as const) {
        for (const n of SIZES[vec4 ? "vec4" : "scalar"]) {
          const x = quantize(uniform(n, 5), dtype), g = quantize(uniform(n, 6), dtype);
          const tx = Tensor.from(x, [n], { dtype, requiresGrad: true });
          const y = add(mul(tx, tx), tx); // x² + x: dx = (2x + 1)·g
          y.backward({ gradient: Tensor.from(g, [n], { dtype }) });
          const label = `${dtype} n=${n} vec4=${vec4}`;
          assertClose(
            await tx.grad!.read(),
            x.map((v, i) => (2 * v + 1) * g[i]),
            TOL[dtype],
            label,
          );
          tx.grad!.dispose();
          tx.dispose();
        }
      }
    }),
});
