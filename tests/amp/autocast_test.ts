import assert from "node:assert/strict";
import { capturedWarnings } from "../helpers/warnings.ts";
import {
  add,
  autocast,
  backward,
  batchNorm,
  cast,
  conv2d,
  crossEntropy,
  customAutocastLists,
  div,
  initGpu,
  layerNormLinear,
  linear,
  matmul,
  mean,
  mul,
  softmax,
  sub,
  sum,
  Tensor,
  tidy,
} from "../../mod.ts";
import { clipGradNorm } from "../../optim/mod.ts";
import { MasterWeights } from "../../amp/master_weights.ts";
import { sizeClass } from "../helpers/internals.ts";
import { dispatchedKernels, gpu as sharedGpu, GPU_TEST } from "../helpers/gpu.ts";
import { matmul64, quantize, uniform } from "../helpers/reference.ts";
import { assertClose, TOL } from "../helpers/assert.ts";

Deno.test({
  name: "autocast: matmul and linear run in f16, softmax and sums in f32, mixed inputs promote",
  ...GPU_TEST,
  async fn() {
    const x = Tensor.from(uniform(6 * 5, 1), [6, 5]);
    const w = Tensor.from(uniform(4 * 5, 2), [4, 5]);
    tidy(() => {
      autocast(() => {
        assert.equal(linear(x, w).dtype, "f16");
        assert.equal(matmul(x, w, { transB: true }).dtype, "f16");
        const h = matmul(x, w, { transB: true });
        assert.equal(softmax(h).dtype, "f32", "softmax is on the f32 list");
        assert.equal(sum(h).dtype, "f32", "sums are on the f32 list");
        assert.equal(add(h, Tensor.zeros([4])).dtype, "f32", "f16 + f32 promotes to f32");
        assert.equal(add(h, h).dtype, "f16");
        autocast(() => assert.equal(matmul(x, w, { transB: true }).dtype, "f32"), {
          enabled: false,
        });
      });
      const lists = customAutocastLists({ deny: ["matmul"] });
      autocast(() => assert.equal(matmul(x, w, { transB: true }).dtype, "f32"), { lists });
    });
    // The f16 product equals the f64 product of f16-rounded inputs (f32 accumulation inside).
    const y = tidy(() => autocast(() => linear(x, w)));
    const ref = matmul64(quantize(uniform(30, 1), "f16"), quantize(uniform(20, 2), "f16"), {
      batch: 1,
      m: 6,
      n: 4,
      k: 5,
      transA: false,
      transB: true,
    });
    assertClose(await y.read(), ref, TOL.f16, "autocast linear");
  },
});

Deno.test({
  name: "autocast: f16 ops read the working copy; gradients land in the fp32 master (+=)",
  ...GPU_TEST,
  async fn() {
    const wv = uniform(3 * 4, 3);
    const w = Tensor.from(wv, [3, 4], { requiresGrad: true });
    const masters = new MasterWeights([w]);
    const copy = masters.copyOf(w)!;
    assert.equal(copy.dtype, "f16");
    assertClose(await copy.read(), quantize(wv, "f16"), { atol: 0, rtol: 0 }, "copy = f16(master)");
    // Prove the op reads the copy: make it differ from the master.
    copy.copyFrom(Tensor.full([3, 4], 1, { dtype: "f16" }));
    const x = Tensor.from(uniform(2 * 4, 4), [2, 4]);
    const y = tidy(() => autocast(() => linear(x, w), { masterWeights: masters }));
    const xs = quantize(uniform(8, 4), "f16");
    const expected = [0, 1].flatMap((r) =>
      [0, 1, 2].map(() => xs.slice(r * 4, r * 4 + 4).reduce((a, b) => a + b, 0))
    );
    assertClose(await y.read(), expected, TOL.f16, "read from the copy");
    // linear writes W's gradient in f32 straight into the master (weightGradTarget); matmul
    // reads the copy as a cast of the master, whose rule casts the copy's f16 gradient up.
    const products = [
      () => linear(x, w),
      () => linear(x, w),
      () => matmul(x, w, { transB: true }),
    ];
    for (const product of products) {
      const loss = tidy(() => autocast(() => sum(product()), { masterWeights: masters }));
      loss.backward();
      loss.dispose();
      assert.equal(w.grad!.dtype, "f32");
    }
    // d Σ(x·Wᵀ) / dW[o, i] = Σ_r x[r, i], three times (three micro-batches accumulate).
    const dw = [0, 1, 2].flatMap(() => [0, 1, 2, 3].map((i) => 3 * (xs[i] + xs[4 + i])));
    assertClose(await w.grad!.read(), dw, TOL.f16, "accumulated master gradient");
    masters.dispose();
  },
});

Deno.test({
  name: "autocast: without shader-f16 it runs in f32 and says so once",
  ...GPU_TEST,
  async fn() {
    const plain = await initGpu({ f16: "off", matmulTiling: "default", setDefault: false });
    const warnings = await capturedWarnings(() => {
      const a = Tensor.zeros([2, 2], { gpu: plain });
      for (let i = 0; i < 2; i++) {
        tidy(() => autocast(() => assert.equal(matmul(a, a).dtype, "f32"), { gpu: plain }));
      }
    });
    plain.destroy();
    assert.equal(warnings.filter((w) => w.includes("no shader-f16")).length, 1);
  },
});

Deno.test({
  name: "clipGradNorm: global norm and clipped gradients match f64; small norms are left alone",
  ...GPU_TEST,
  async fn() {
    const values = [uniform(7, 1, -3, 3), uniform(1031, 2, -3, 3), uniform(1, 3, -3, 3)];
    const make = () =>
      values.map((v) => {
        const p = Tensor.zeros([v.length], { requiresGrad: true });
        p.grad = Tensor.from(v, [v.length]);
        return p;
      });
    const norm = Math.sqrt(values.reduce((s, v) => s + v.reduce((a, b) => a + b * b, 0), 0));
    const params = make();
    const { totalNorm, coefficient } = clipGradNorm(params, 1.5);
    assertClose(await totalNorm.read(), [norm], TOL.f32, "norm");
    const coef = Math.min(1, 1.5 / (norm + 1e-6));
    assertClose(await coefficient.read(), [coef], TOL.f32, "coefficient");
    for (const [i, p] of params.entries()) {
      assertClose(await p.grad!.read(), values[i].map((v) => v * coef), TOL.f32, `clipped ${i}`);
    }
    const untouched = make();
    clipGradNorm(untouched, 1.5, { inPlace: false });
    assertClose(
      await untouched[1].grad!.read(),
      quantize(values[1], "f32"),
      { atol: 0, rtol: 0 },
      "inPlace: false",
    );
    const big = make();
    const { coefficient: one } = clipGradNorm(big, norm * 2);
    assert.equal(await one.item(), 1);
    assertClose(
      await big[0].grad!.read(),
      quantize(values[0], "f32"),
      { atol: 0, rtol: 0 },
      "no clipping",
    );
    assert.throws(() => clipGradNorm(params, 0), /maxNorm must be a positive finite number, got 0/);
  },
});

Deno.test({
  name: "clipGradNorm: gradients of millions of elements count in full (a workgroup per chunk)",
  ...GPU_TEST,
  async fn() {
    // 5,000,003 elements: past the ~4.2M a single workgroup summed before lavapipe's loop cap.
    const sizes = [5_000_003, 600_001, 3];
    const params = sizes.map((n, i) => {
      const p = Tensor.zeros([1], { requiresGrad: true });
      p.grad = Tensor.full([n], 0.25 * (i + 1));
      return p;
    });
    const expected = Math.sqrt(sizes.reduce((s, n, i) => s + n * (0.25 * (i + 1)) ** 2, 0));
    const { totalNorm, coefficient } = clipGradNorm(params, 1, { inPlace: false });
    assertClose(await totalNorm.read(), [expected], { atol: 0, rtol: 1e-4 }, "norm");
    assertClose(await coefficient.read(), [1 / (expected + 1e-6)], { atol: 0, rtol: 1e-4 }, "coef");
    for (const p of params) p.dispose();
  },
});

Deno.test({
  name: "autocast: a promoting add holds no f32 copy of its f16 operand; gradients flow",
  ...GPU_TEST,
  async fn() {
    const n = 1024;
    const x = Tensor.from(uniform(n, 1), [n], { requiresGrad: true });
    const h = Tensor.from(uniform(n, 2), [n], { dtype: "f16", requiresGrad: true });
    const gpu = x.gpu;
    const { held, y } = autocast(() => {
      const before = gpu.memoryStats().allocatedBytes;
      const y = add(x, h); // f32 + f16: promoted inside the kernel, no f32 copy of h
      return { held: gpu.memoryStats().allocatedBytes - before, y };
    });
    assert.equal(y.dtype, "f32");
    assert.equal(held, n * 4, "only the result is held, no f32 copy of h");
    const loss = sum(mul(y, y));
    backward(loss);
    const expected = Float64Array.from(await y.read(), (v) => 2 * v);
    assertClose(await x.grad!.read(), expected, TOL.f32, "dx");
    assert.equal(h.grad!.dtype, "f16");
    assertClose(await h.grad!.read(), quantize(expected, "f16"), TOL.f16, "dh");
    for (const t of [x, h, y, loss]) t.dispose();
  },
});

/**
 * `op` over `inputs` under autocast (which widens its f16 and bf16 inputs
 * inside the kernel) and over the inputs cast to f32 by hand: the output, every
 * input's gradient (in the input's own dtype), and the dispatches of each
 * forward.
 */
async function widenedAndCastFirst(
  label: string,
  inputs: readonly Tensor[],
  op: (...xs: Tensor[]) => Tensor,
  gradient: Tensor,
) {
  const run = async (inKernel: boolean) => {
    let y!: Tensor;
    const kernels = dispatchedKernels(() => {
      y = inKernel
        ? autocast(() => op(...inputs))
        : op(...inputs.map((t) => t.dtype !== "f32" ? cast(t, "f32") : t));
    });
    backward(y, { gradient });
    const out = [await y.read()];
    for (const t of inputs) {
      assert.equal(t.grad!.dtype, t.dtype, label);
      out.push(await t.grad!.read());
      t.grad!.dispose();
      t.grad = null;
    }
    y.dispose();
    return { out, kernels };
  };
  return { inKernel: await run(true), castFirst: await run(false) };
}

/** The half dtypes whose reads widen in kernels; f16 is skipped without shader-f16. */
const HALVES = (["f16", "bf16"] as const).filter((d) => d === "bf16" || sharedGpu.f16);

for (const half of HALVES) {
  Deno.test({
    name:
      `autocast: binary ops promote an ${half} operand in their kernel (one dispatch, no cast), ` +
      "with the bits of casting it first, and hand each operand a gradient in its dtype",
    ...GPU_TEST,
    async fn() {
      const [m, n] = [7, 33];
      const ops = { add, sub, mul, div };
      // [first, second] operand shapes and dtypes: the half on either side, broadcast or not.
      const pairs = [
        [[m, n], "f32", [m, n], half],
        [[m, n], half, [m, n], "f32"],
        [[m, n], "f32", [n], half],
        [[m, n], half, [1, n], "f32"],
      ] as const;
      for (const [name, op] of Object.entries(ops)) {
        for (const [shapeA, dtypeA, shapeB, dtypeB] of pairs) {
          const label = `${name} ${dtypeA}[${shapeA}] ${dtypeB}[${shapeB}]`;
          const sizeA = shapeA.reduce((p, d) => p * d, 1),
            sizeB = shapeB.reduce((p, d) => p * d, 1);
          const grad = { requiresGrad: true };
          const a = Tensor.from(uniform(sizeA, 3, 0.5, 2), [...shapeA], { dtype: dtypeA, ...grad });
          const b = Tensor.from(uniform(sizeB, 4, 0.5, 2), [...shapeB], { dtype: dtypeB, ...grad });
          const g = Tensor.from(uniform(m * n, 5), [m, n]);
          const { inKernel, castFirst } = await widenedAndCastFirst(label, [a, b], op, g);
          assert.equal(inKernel.kernels.length, 1, `${label}: ${inKernel.kernels}`);
          assert.equal(castFirst.kernels.length, 2, label);
          assert.deepEqual(inKernel.out, castFirst.out, label);
          for (const t of [a, b, g]) t.dispose();
        }
      }
    },
  });
}

for (const half of HALVES) {
  Deno.test({
    name: `autocast: sum and mean read ${half} in their kernel (no cast up) and write the ` +
      `gradient in ${half}, with the bits of casting first`,
    ...GPU_TEST,
    async fn() {
      const x = Tensor.from(uniform(7 * 33, 8), [7, 33], { dtype: half, requiresGrad: true });
      const cases = [
        ["sum", (t: Tensor) => sum(t), []],
        ["mean over rows", (t: Tensor) => mean(t, { axis: 0 }), [33]],
      ] as const;
      for (const [label, op, shape] of cases) {
        const g = Tensor.from(uniform(shape.length === 0 ? 1 : 33, 9), [...shape]);
        const { inKernel, castFirst } = await widenedAndCastFirst(label, [x], op, g);
        assert.ok(!inKernel.kernels.some((k) => k.includes("op=identity")), `${inKernel.kernels}`);
        assert.deepEqual(inKernel.out, castFirst.out, label);
        g.dispose();
      }
      x.dispose();
    },
  });
}

for (const half of HALVES) {
  Deno.test({
    name: `autocast: BatchNorm reads ${half} input in its kernel (no cast up, ${half} saved), ` +
      `writes f32, and gives dx in ${half}, with the bits of casting first`,
    ...GPU_TEST,
    async fn() {
      const shape = [3, 4, 5, 7], c = 4;
      const grad = { requiresGrad: true };
      const x = Tensor.from(uniform(3 * 4 * 35, 10, -2, 3), shape, { dtype: half, ...grad });
      const w = Tensor.from(uniform(c, 11, 0.5, 1.5), [c], grad);
      const b = Tensor.from(uniform(c, 12), [c], grad);
      const runningMean = Tensor.zeros([c]), runningVar = Tensor.full([c], 1);
      const op = (t: Tensor, weight: Tensor, bias: Tensor) =>
        batchNorm(t, { weight, bias, runningMean, runningVar, training: true });
      const g = Tensor.from(uniform(3 * 4 * 35, 13), shape);
      const { inKernel, castFirst } = await widenedAndCastFirst("batchNorm", [x, w, b], op, g);
      assert.ok(!inKernel.kernels.some((k) => k.includes("op=identity")), `${inKernel.kernels}`);
      assert.deepEqual(inKernel.out, castFirst.out);
      const held = autocast(() => {
        const before = x.gpu.memoryStats().allocatedBytes;
        const y = op(x, w, b);
        const bytes = x.gpu.memoryStats().allocatedBytes - before;
        y.dispose();
        return bytes;
      });
      // y (f32) and the f32 [C] mean and rstd: the tape keeps x itself, not an f32 copy.
      assert.equal(held, sizeClass(x.size * 4) + 2 * sizeClass(c * 4));
      for (const t of [x, w, b, runningMean, runningVar, g]) t.dispose();
    },
  });
}

for (const half of HALVES) {
  Deno.test({
    name: `autocast: cross-entropy reads ${half} logits in its kernel (no cast up) and writes ` +
      `their gradient in ${half}, with the bits of casting them first`,
    ...GPU_TEST,
    async fn() {
      const [rows, classes] = [9, 13];
      const logits = Tensor.from(uniform(rows * classes, 6, -4, 4), [rows, classes], {
        dtype: half,
        requiresGrad: true,
      });
      const targets = Tensor.from(
        Array.from({ length: rows }, (_, i) => (i * 5) % classes),
        [rows],
        {
          dtype: "i32",
        },
      );
      const loss = (x: Tensor) => crossEntropy(x, targets, { labelSmoothing: 0.1 });
      const one = Tensor.full([], 1);
      const { inKernel, castFirst } = await widenedAndCastFirst(
        "crossEntropy",
        [logits],
        loss,
        one,
      );
      assert.ok(!inKernel.kernels.some((k) => k.includes("op=identity")), `${inKernel.kernels}`);
      assert.ok(castFirst.kernels.some((k) => k.includes("op=identity")), "the reference casts");
      assert.deepEqual(inKernel.out, castFirst.out);
      for (const t of [logits, targets, one]) t.dispose();
    },
  });
}

Deno.test({
  name:
    "autocast: an f16 linear layer writes its weight gradient in f32 straight into the master, " +
    "so gradients below f16's range survive (linear, layerNormLinear, conv2d)" +
    (sharedGpu.f16 ? "" : " (ignored: the adapter has no shader-f16)"),
  ignore: !sharedGpu.f16,
  ...GPU_TEST,
  async fn() {
    const gpu = await initGpu({ matmulTiling: "default" });
    assert.ok(gpu.f16, "the shared device has shader-f16, so a new one has it too");
    // x = 2⁻¹⁴ and an upstream gradient of 2⁻¹⁴ (both normal f16): each dW entry is
    // 4 · 2⁻²⁸ = 2⁻²⁶, below f16's smallest subnormal 2⁻²⁴, so an f16 dW would be 0.
    const tiny = 2 ** -14;
    for (const op of ["linear", "layerNormLinear", "conv2d"] as const) {
      // conv2d: a 1×1 kernel over 2×2 positions sums four products per weight too.
      const conv = op === "conv2d";
      const x = Tensor.full(conv ? [1, 3, 2, 2] : [4, 3], tiny);
      const w = Tensor.from(uniform(6, 2), conv ? [2, 3, 1, 1] : [2, 3], { requiresGrad: true });
      const masterWeights = new MasterWeights([w]);
      tidy(() => {
        const y = autocast(() =>
          op === "linear" ? linear(x, w) : conv
            ? conv2d(x, w)
            // LayerNorm of a constant row is its bias: β = 2⁻¹⁴ reproduces x.
            : layerNormLinear(x, w, { norm: { bias: Tensor.full([3], tiny) } }), { masterWeights });
        assert.equal(y.dtype, "f16");
        y.backward({ gradient: Tensor.full(y.shape, tiny, { dtype: "f16" }) });
      });
      assert.equal(w.grad!.dtype, "f32");
      assertClose(await w.grad!.read(), new Array(6).fill(2 ** -26), { atol: 0, rtol: 1e-6 }, op);
      masterWeights.dispose();
      for (const t of [x, w]) t.grad?.dispose(), t.dispose();
    }
  },
});
