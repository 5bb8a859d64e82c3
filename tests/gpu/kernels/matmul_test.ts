import assert from "node:assert/strict";
import {
  add,
  backward,
  classOf,
  DTYPES,
  type FloatDType,
  initGpu,
  linear,
  matmul,
  MATMUL_CANDIDATES,
  matmulCandidates,
  matmulClassKey,
  mul,
  relu,
  sum,
  Tensor,
  tidy,
  tilingFor,
  tilingName,
  tuneMatmul,
} from "../../../gpu/mod.ts";
import { gpu, GPU_TEST, withEachTiling } from "../../helpers/gpu.ts";
import { gradcheck } from "../../helpers/gradcheck.ts";
import { matmul64, quantize, uniform } from "../../helpers/reference.ts";
import { assertClose, TOL, tolFor } from "../../helpers/assert.ts";
import { matmulSettings } from "../../../gpu/kernels/gemm/settings.ts";
import { matmulShapeKey, shapeOf } from "../../../gpu/kernels/gemm/shape_picks.ts";

// Sizes that are multiples of no tile, a single element, and a long K.
const SHAPES = [
  { m: 1, k: 1, n: 1 },
  { m: 7, k: 33, n: 5 },
  { m: 33, k: 7, n: 129 },
  { m: 129, k: 65, n: 33 },
  { m: 3, k: 4096, n: 7 },
];

async function checkProduct(
  dtype: FloatDType,
  dims: { batch: number; m: number; n: number; k: number; transA: boolean; transB: boolean },
  seed: number,
) {
  const { batch, m, n, k, transA, transB } = dims;
  const a = quantize(uniform(batch * m * k, seed), dtype);
  const b = quantize(uniform(batch * k * n, seed + 1), dtype);
  const aShape = transA ? [k, m] : [m, k], bShape = transB ? [n, k] : [k, n];
  const batched = (s: number[]) => (batch > 1 ? [batch, ...s] : s);
  const ta = Tensor.from(a, batched(aShape), { dtype });
  const tb = Tensor.from(b, batched(bShape), { dtype });
  const c = matmul(ta, tb, { transA, transB });
  const expected = matmul64(a, b, dims);
  const label = `${dtype} ${JSON.stringify(dims)} tiling ${
    JSON.stringify(matmulSettings.of(gpu).tiling)
  }`;
  assertClose(await c.read(), expected, tolFor(dtype, k), label);
  [ta, tb, c].forEach((t) => t.dispose());
}

Deno.test({
  name: "matmul: every tiling candidate, dtype, transpose, batch and odd shape matches f64",
  ...GPU_TEST,
  async fn() {
    await withEachTiling(async () => {
      for (const dtype of DTYPES) {
        for (const [i, s] of SHAPES.entries()) {
          for (const transA of [false, true]) {
            for (const transB of [false, true]) {
              await checkProduct(dtype, { batch: 1, ...s, transA, transB }, 10 * i);
            }
          }
        }
        // Batched, as attention's [B·H, T, D] products.
        for (const [transA, transB] of [[false, true], [false, false], [true, false]]) {
          await checkProduct(dtype, { batch: 3, m: 33, n: 17, k: 65, transA, transB }, 7);
        }
      }
    });
  },
});

Deno.test({
  name: "matmul: batched operands and a shared right operand",
  ...GPU_TEST,
  async fn() {
    for (const dtype of DTYPES) {
      await checkProduct(dtype, { batch: 3, m: 9, n: 17, k: 13, transA: false, transB: true }, 1);
      await checkProduct(dtype, { batch: 2, m: 5, n: 3, k: 70, transA: true, transB: false }, 2);
    }
    const a = uniform(3 * 5 * 6, 3), b = uniform(6 * 4, 4);
    const c = matmul(Tensor.from(a, [3, 5, 6]), Tensor.from(b, [6, 4]));
    const expected = matmul64(a, b, {
      batch: 3,
      m: 5,
      n: 4,
      k: 6,
      transA: false,
      transB: false,
      shareB: true,
    });
    assertClose(await c.read(), expected, TOL.f32, "shared B");
  },
});

Deno.test({
  name: "matmul: gradients of every transpose variant match f64 references",
  ...GPU_TEST,
  async fn() {
    const m = 7, k = 9, n = 5;
    for (const transA of [false, true]) {
      for (const transB of [false, true]) {
        const a = uniform(m * k, 1), b = uniform(k * n, 2), g = uniform(m * n, 3);
        const ta = Tensor.from(a, transA ? [k, m] : [m, k], { requiresGrad: true });
        const tb = Tensor.from(b, transB ? [n, k] : [k, n], { requiresGrad: true });
        const c = matmul(ta, tb, { transA, transB });
        backward(c, { gradient: Tensor.from(g, [m, n]) });
        // dop(A) = G·op(B)ᵀ and dop(B) = op(A)ᵀ·G, computed from the definitions.
        const opA = (i: number, q: number) => a[transA ? q * m + i : i * k + q];
        const opB = (q: number, j: number) => b[transB ? j * k + q : q * n + j];
        const da = new Float64Array(m * k), db = new Float64Array(k * n);
        for (let i = 0; i < m; i++) {
          for (let q = 0; q < k; q++) {
            for (let j = 0; j < n; j++) {
              const gij = g[i * n + j];
              da[transA ? q * m + i : i * k + q] += gij * opB(q, j);
              db[transB ? j * k + q : q * n + j] += opA(i, q) * gij;
            }
          }
        }
        const label = `transA=${transA} transB=${transB}`;
        assertClose(await ta.grad!.read(), da, TOL.f32, `dA ${label}`);
        assertClose(await tb.grad!.read(), db, TOL.f32, `dB ${label}`);
      }
    }
  },
});

Deno.test({
  name: "matmul: gradient of batched and shared-B products by finite differences",
  ...GPU_TEST,
  async fn() {
    const w = Tensor.from(uniform(2 * 4 * 3, 9), [2, 4, 3]);
    await gradcheck(
      "batched matmul",
      ([a, b]) => sum(mul(matmul(a, b, { transB: true }), w)),
      [uniform(2 * 4 * 6, 1), uniform(2 * 3 * 6, 2)],
      [[2, 4, 6], [2, 3, 6]],
    );
    await gradcheck(
      "shared-B matmul",
      ([a, b]) => sum(mul(matmul(a, b), w)),
      [uniform(2 * 4 * 6, 3), uniform(6 * 3, 4)],
      [[2, 4, 6], [6, 3]],
    );
    await gradcheck(
      "shared-Bᵀ matmul",
      ([a, b]) => sum(mul(matmul(a, b, { transB: true }), w)),
      [uniform(2 * 4 * 6, 5), uniform(3 * 6, 6)],
      [[2, 4, 6], [3, 6]],
    );
  },
});

Deno.test({
  name: "linear: fused bias and ReLU epilogue match the f64 reference, forward and backward",
  ...GPU_TEST,
  async fn() {
    const rows = 13, inF = 21, outF = 10;
    for (const dtype of DTYPES) {
      for (const activation of ["none", "relu"] as const) {
        const x = quantize(uniform(rows * inF, 1), dtype);
        const w = quantize(uniform(outF * inF, 2), dtype);
        const b = uniform(outF, 3);
        const g = quantize(uniform(rows * outF, 4), dtype);
        const tx = Tensor.from(x, [rows, inF], { dtype, requiresGrad: true });
        const tw = Tensor.from(w, [outF, inF], { dtype, requiresGrad: true });
        const tb = Tensor.from(b, [outF], { requiresGrad: true }); // f32 bias, as AMP keeps it
        const y = linear(tx, tw, { bias: tb, activation });
        const pre = matmul64(x, w, {
          batch: 1,
          m: rows,
          n: outF,
          k: inF,
          transA: false,
          transB: true,
        })
          .map((v, i) => v + b[i % outF]);
        const expected = pre.map((v) => (activation === "relu" ? Math.max(v, 0) : v));
        const label = `${dtype} ${activation}`;
        assertClose(await y.read(), expected, TOL[dtype], `linear forward ${label}`);
        backward(y, { gradient: Tensor.from(g, [rows, outF], { dtype }) });
        const gp = g.map((v, i) => (activation === "relu" && pre[i] <= 0 ? 0 : v));
        const dx = matmul64(gp, w, {
          batch: 1,
          m: rows,
          n: inF,
          k: outF,
          transA: false,
          transB: false,
        });
        const dw = matmul64(gp, x, {
          batch: 1,
          m: outF,
          n: inF,
          k: rows,
          transA: true,
          transB: false,
        });
        const db = new Float64Array(outF);
        gp.forEach((v, i) => (db[i % outF] += v));
        assertClose(await tx.grad!.read(), dx, TOL[dtype], `linear dx ${label}`);
        assertClose(await tw.grad!.read(), dw, TOL[dtype], `linear dW ${label}`);
        assertClose(await tb.grad!.read(), db, TOL[dtype], `linear db ${label}`);
      }
    }
  },
});

Deno.test({
  name: "linear: equals the composed matmul + bias + relu, and finite differences agree",
  ...GPU_TEST,
  async fn() {
    const [x, wt, b] = [
      Tensor.from(uniform(9 * 7, 1), [9, 7]),
      Tensor.from(uniform(5 * 7, 2), [5, 7]),
      Tensor.from(uniform(5, 3), [5]),
    ];
    const fused = linear(x, wt, { bias: b, activation: "relu" });
    const composed = relu(add(matmul(x, wt, { transB: true }), b));
    assertClose(await fused.read(), await composed.read(), TOL.f32, "fused vs composed");
    const w = Tensor.from(uniform(6 * 4, 8), [6, 4]);
    await gradcheck(
      "linear relu",
      ([x, wt, b]) => sum(mul(linear(x, wt, { bias: b, activation: "relu" }), w)),
      [uniform(6 * 5, 1), uniform(4 * 5, 2), uniform(4, 3)],
      [[6, 5], [4, 5], [4]],
    );
    await gradcheck(
      "linear 3-D input",
      ([x, wt]) => sum(mul(linear(x, wt), Tensor.from(uniform(2 * 3 * 4, 5), [2, 3, 4]))),
      [uniform(2 * 3 * 5, 1), uniform(4 * 5, 2)],
      [[2, 3, 5], [4, 5]],
    );
  },
});

Deno.test({
  name: "matmul: bad shapes and dtypes are clear errors naming op, shapes and dtypes",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const a = Tensor.zeros([2, 3]), b = Tensor.zeros([4, 5]);
      assert.throws(
        () => matmul(a, b),
        /matmul: cannot multiply f32 \[2, 3\] by f32 \[4, 5\]: inner sizes 3 and 4 differ/,
      );
      assert.throws(
        () => matmul(a, Tensor.zeros([3, 2], { dtype: "f16" })),
        /matmul: dtypes differ \(f32 \[2, 3\] and f16 \[3, 2\]\)/,
      );
      assert.throws(() => matmul(Tensor.zeros([3]), b), /matrices/);
      assert.throws(
        () => linear(a, Tensor.zeros([4, 3]), { bias: Tensor.zeros([5]) }),
        /linear: bias f32 \[5\] must have shape \[4\]/,
      );
    });
  },
});

Deno.test({
  name: "matmul tuning: measures every candidate per class, caches the winners, dispatch uses them",
  ...GPU_TEST,
  async fn() {
    const classes = [
      { dtype: "f32", orientation: "nt", size: "small" },
      { dtype: "f32", orientation: "tn", size: "small" },
      // bf16 is a class of its own (its own key and winner), on any adapter.
      { dtype: "bf16", orientation: "nt", size: "small" },
    ] as const;
    try {
      const results = await tuneMatmul(gpu, { classes, force: true });
      assert.equal(results.length, 3);
      for (const result of results) {
        assert.equal(result.cached, false);
        assert.equal(
          result.measurements.length,
          matmulCandidates(gpu, result.class.dtype).length,
        );
        // The figures agree: GFLOP/s × seconds is the class's 2·m·n·k (64×128×256 for small).
        for (const m of result.measurements) {
          assert.ok(m.seconds > 0 && Number.isFinite(m.seconds), tilingName(m.tiling));
          assertClose([m.gflops * 1e9 * m.seconds], [2 * 64 * 128 * 256], {
            atol: 0,
            rtol: 1e-9,
          }, `${tilingName(m.tiling)}: gflops × seconds`);
        }
        const fastest = result.measurements.reduce((a, b) => (b.gflops > a.gflops ? b : a));
        assert.equal(result.best, fastest.tiling);
        assert.equal(
          matmulSettings.of(gpu).classTilings.get(matmulClassKey(result.class)),
          result.best,
        );
      }
      const again = await tuneMatmul(gpu, { classes });
      assert.ok(again.every((r, i) => r.cached && r.best === results[i].best), "from the cache");
      // Dispatch picks the class's winner: x·Wᵀ of a small linear layer is f32/nt/small.
      const problem = {
        batch: 1,
        m: 8,
        n: 16,
        k: 32,
        a: { batch: 0, row: 32, col: 1 },
        b: { batch: 0, row: 1, col: 32 },
      };
      assert.deepEqual(classOf(problem, "f32"), classes[0]);
      assert.equal(tilingFor(gpu, problem, "f32"), results[0].best);
      assert.deepEqual(classOf(problem, "bf16"), classes[2]);
      assert.notEqual(
        matmulClassKey(classes[2]),
        matmulClassKey(classes[0]),
        "bf16: a class of its own",
      );
      assert.equal(tilingFor(gpu, problem, "bf16"), results[2].best);
      // And per-shape picks key bf16 products apart from f32 ones.
      const shape = shapeOf(problem, { dtype: "bf16", out: "bf16" }, {
        bias: "bf16",
        activation: "relu",
      });
      assert.deepEqual(shape, {
        m: 8,
        n: 16,
        k: 32,
        batch: 1,
        orientation: "nt",
        dtype: "bf16",
        out: "bf16",
        bias: "bf16",
        activation: "relu",
      });
      const f32 = shapeOf(problem, { dtype: "f32", out: "f32" }, {
        bias: "f32",
        activation: "relu",
      });
      assert.notEqual(matmulShapeKey(shape), matmulShapeKey(f32));
      // A class never tuned falls back to the device default.
      assert.equal(
        tilingFor(gpu, { ...problem, b: { batch: 0, row: 16, col: 1 } }, "f16"),
        matmulSettings.of(gpu).tiling,
      );
    } finally {
      matmulSettings.of(gpu).classTilings.clear();
    }
    const forced = MATMUL_CANDIDATES.at(-1)!;
    const other = await initGpu({ matmulTiling: forced, setDefault: false });
    assert.equal(matmulSettings.of(other).tiling, forced);
    assert.equal(
      matmulSettings.of(other).classTilings.size,
      0,
      "a given tiling is used for every class",
    );
    other.destroy();
  },
});
