import assert from "node:assert/strict";
import {
  add,
  addScalar,
  div,
  mean,
  mul,
  noGrad,
  sqrt,
  square,
  sub,
  sum,
  Tensor,
  tidy,
} from "../../../gpu/mod.ts";
import { layerNorm } from "../../../gpu/ops/layer_norm.ts";
import { gpu, GPU_TEST, withEachRowLayout } from "../../helpers/gpu.ts";
import { gradcheck } from "../../helpers/gradcheck.ts";
import { layerNormCase } from "../../helpers/layer_norm_case.ts";
import { layerNorm64, quantize, uniform } from "../../helpers/reference.ts";
import { assertClose, TOL, type Tolerance } from "../../helpers/assert.ts";

// dweight / dbias are f32 sums over up to 129 rows of terms up to ~3 in size,
// accumulated in f32 (as are the f16 cases: their inputs are rounded to f16
// before the reference runs, so only f32 accumulation error remains).
const PARAM_TOL: Tolerance = { atol: 1e-4, rtol: 1e-4 };

Deno.test({
  name: "layerNorm: forward and backward match f64, f32, f16 and bf16, odd shapes",
  ...GPU_TEST,
  async fn() {
    await withEachRowLayout(async () => {
      for (const rows of [1, 7, 129]) {
        for (const cols of [1, 5, 33, 1000]) {
          for (const dtype of ["f32", "f16", "bf16"] as const) {
            const label = `${dtype} [${rows}, ${cols}]`;
            const { g, b, tx, tw, tb, ref } = layerNormCase(rows, cols, dtype);
            const y = layerNorm(tx, { weight: tw, bias: tb });
            assert.equal(y.dtype, dtype);
            // f16/bf16: y and dx are stored in f16/bf16 (relative half-ulp 4.9e-4 / 3.9e-3 of
            // values up to ~4); TOL covers that. f32: f32 statistics and arithmetic, TOL.f32.
            assertClose(await y.read(), ref.y, TOL[dtype], `y ${label}`);
            y.backward({ gradient: Tensor.from(g, [rows, cols], { dtype }) });
            assert.equal(tx.grad!.dtype, dtype);
            assert.equal(tw.grad!.dtype, "f32");
            assert.equal(tb.grad!.dtype, "f32");
            assertClose(await tx.grad!.read(), ref.dx, TOL[dtype], `dx ${label}`);
            assertClose(await tw.grad!.read(), ref.dw, PARAM_TOL, `dweight ${label}`);
            assertClose(await tb.grad!.read(), ref.db, PARAM_TOL, `dbias ${label}`);
            if (cols === 1) {
              // A single value per row normalises to 0: y is the bias and dx is 0.
              assertClose(await y.read(), new Float64Array(rows).fill(b[0]), TOL[dtype], label);
            }
            for (const t of [tx, tw, tb]) {
              t.grad!.dispose();
              t.dispose();
            }
            y.dispose();
          }
        }
      }
    });
  },
});

Deno.test({
  name: "layerNorm: rank 3 input, no weight or no bias, custom eps",
  ...GPU_TEST,
  async fn() {
    const [d0, d1, cols] = [3, 43, 33], n = d0 * d1 * cols;
    const x = quantize(uniform(n, 1, -1, 1), "f32"), g = quantize(uniform(n, 2), "f32");
    const w = quantize(uniform(cols, 3, 0.5, 1.5), "f32");
    for (const affine of ["none", "weight", "bias"] as const) {
      const tx = Tensor.from(x, [d0, d1, cols], { requiresGrad: true });
      const tw = affine === "weight" ? Tensor.from(w, [cols], { requiresGrad: true }) : null;
      const tb = affine === "bias" ? Tensor.from(w, [cols], { requiresGrad: true }) : null;
      const y = layerNorm(tx, { weight: tw, bias: tb, eps: 0.1 });
      assert.deepEqual(y.shape, [d0, d1, cols]);
      const ref = layerNorm64(x, g, cols, tw ? w : null, tb ? w : null, 0.1);
      assertClose(await y.read(), ref.y, TOL.f32, `y ${affine}`);
      y.backward({ gradient: Tensor.from(g, y.shape) });
      assertClose(await tx.grad!.read(), ref.dx, TOL.f32, `dx ${affine}`);
      if (tw) assertClose(await tw.grad!.read(), ref.dw, PARAM_TOL, "dweight");
      if (tb) assertClose(await tb.grad!.read(), ref.db, PARAM_TOL, "dbias");
      for (const t of [tx, tw, tb]) {
        t?.grad?.dispose();
        t?.dispose();
      }
    }
  },
});

Deno.test({
  name:
    "layerNorm over one feature: y is the bias and dx exactly 0, bit for bit, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    await withEachRowLayout(async () => {
      // The row mean must equal its one element exactly, or x − mean is a rounding
      // residue that 1/sqrt(eps) magnifies (an NVIDIA GPU gave dx = −1.7e-5).
      const rows = 129;
      for (const dtype of ["f32", "f16", "bf16"] as const) {
        const x = quantize(uniform(rows, 5, -300, 300), dtype);
        const tx = Tensor.from(x, [rows, 1], { dtype, requiresGrad: true });
        const w = Tensor.from([1.5], [1], { requiresGrad: true });
        const b = Tensor.from([0.25], [1], { requiresGrad: true });
        const y = layerNorm(tx, { weight: w, bias: b });
        assert.deepEqual(Array.from(await y.read()), new Array(rows).fill(0.25), `${dtype} y`);
        y.backward({ gradient: Tensor.from(uniform(rows, 6), [rows, 1], { dtype }) });
        const dx = await tx.grad!.read();
        assert.ok(dx.every((v) => v === 0), `${dtype} dx has ${dx.find((v) => v !== 0)}`);
        assert.equal((await w.grad!.read())[0], 0, "x̂ is 0, so dweight is 0");
        for (const t of [tx, w, b]) {
          t.grad?.dispose();
          t.dispose();
        }
      }
    });
  },
});

/** LayerNorm composed from primitive ops (each with its own gradient rule). */
function composedLayerNorm(x: Tensor, w: Tensor, b: Tensor, eps: number): Tensor {
  const centred = sub(x, mean(x, { axis: -1, keepDims: true }));
  const variance = mean(square(centred), { axis: -1, keepDims: true });
  return add(mul(div(centred, sqrt(addScalar(variance, eps))), w), b);
}

Deno.test({
  name: "layerNorm: the fused kernels agree with the version composed from primitive ops",
  ...GPU_TEST,
  async fn() {
    for (const [rows, cols] of [[7, 33], [129, 5], [2, 1000]]) {
      const n = rows * cols;
      const results: (Float32Array | Int32Array)[][] = [];
      for (const fused of [true, false]) {
        const tx = Tensor.from(uniform(n, n, -3, 2), [rows, cols], { requiresGrad: true });
        const tw = Tensor.from(uniform(cols, 2, 0.5, 2), [cols], { requiresGrad: true });
        const tb = Tensor.from(uniform(cols, 3), [cols], { requiresGrad: true });
        const y = tidy(() =>
          fused
            ? layerNorm(tx, { weight: tw, bias: tb, eps: 1e-3 })
            : composedLayerNorm(tx, tw, tb, 1e-3)
        );
        y.backward({ gradient: Tensor.from(uniform(n, 4), [rows, cols]) });
        results.push([
          await y.read(),
          ...(await Promise.all([tx, tw, tb].map((t) => t.grad!.read()))),
        ]);
        for (const t of [tx, tw, tb]) {
          t.grad!.dispose();
          t.dispose();
        }
        y.dispose();
      }
      // Both are f32 computations of the same function in a different order.
      ["y", "dx", "dweight", "dbias"].forEach((what, i) =>
        assertClose(results[0][i], results[1][i], PARAM_TOL, `${what} [${rows}, ${cols}]`)
      );
    }
  },
});

Deno.test({
  name: "layerNorm: gradients agree with finite differences",
  ...GPU_TEST,
  async fn() {
    const r = Tensor.from(uniform(4 * 9, 8), [4, 9]);
    await gradcheck(
      "layerNorm",
      ([x, w, b]) => sum(mul(layerNorm(x, { weight: w, bias: b }), r)),
      [uniform(36, 1, -2, 2), uniform(9, 2, 0.5, 1.5), uniform(9, 3)],
      [[4, 9], [9], [9]],
    );
    r.dispose();
  },
});

Deno.test({
  name: "layerNorm: saved statistics are freed after backward, when the graph is dropped, " +
    "and at once without grad",
  ...GPU_TEST,
  async fn() {
    await gpu.sync();
    const before = gpu.memoryStats().allocatedBytes;
    for (const run of ["backward", "drop", "no grad"] as const) {
      const x = Tensor.from(uniform(6 * 7, 1), [6, 7], { requiresGrad: run !== "no grad" });
      const w = Tensor.full([7], 1, { requiresGrad: run !== "no grad" });
      const y = layerNorm(x, { weight: w });
      if (run === "backward") {
        const loss = sum(y);
        loss.backward();
        loss.dispose();
      }
      for (const t of [x, w, y]) {
        t.grad?.dispose();
        t.dispose();
      }
      assert.equal(gpu.memoryStats().allocatedBytes, before, `${run}: buffers still held`);
    }
    noGrad(() => tidy(() => void layerNorm(Tensor.zeros([2, 3]))));
    assert.equal(gpu.memoryStats().allocatedBytes, before, "tidy: buffers still held");
  },
});

Deno.test({
  name: "layerNorm: wrong dtypes and shapes are clear errors",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const x = Tensor.zeros([2, 4], { dtype: "f16" });
      assert.throws(
        () => layerNorm(x, { weight: Tensor.zeros([4], { dtype: "f16" }) }),
        /layerNorm: weight must be f32 \[4\] .*input f16 \[2, 4\], got f16 \[4\]/,
      );
      assert.throws(
        () => layerNorm(x, { bias: Tensor.zeros([2, 4]) }),
        /layerNorm: bias must be f32 \[4\] .*got f32 \[2, 4\]/,
      );
      assert.throws(
        () => layerNorm(Tensor.zeros([2, 4], { dtype: "i32" })),
        /layerNorm: input i32 \[2, 4\] must be f32, f16 or bf16/,
      );
      assert.throws(() => layerNorm(Tensor.zeros([])), /layerNorm: input f32 \[\]/);
      assert.throws(() => layerNorm(x, { eps: -1 }), /eps must be/);
    });
  },
});
