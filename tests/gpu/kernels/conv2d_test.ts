import assert from "node:assert/strict";
import { DTYPES, type FloatDType, mul, sum, Tensor, tidy } from "../../../gpu/mod.ts";
import { conv2d, type Conv2dOptions } from "../../../gpu/mod.ts";
import {
  asGpu,
  dispatchedKernels,
  dispatchedKernelsAsync,
  gpu,
  GPU_TEST,
  withEachTiling,
  withTiling,
} from "../../helpers/gpu.ts";
import { subgroupMatrixCandidates } from "../../../gpu/kernels/gemm/candidates.ts";
import { f16MatrixConfig } from "../../helpers/internals.ts";
import { MATMUL_CANDIDATES } from "../../../gpu/kernels/gemm/class_tuner.ts";
import { gemmSplit } from "../../../gpu/kernels/gemm/gemm.ts";
import { tilingName } from "../../../gpu/kernels/gemm/matmul_class.ts";
import { gradcheck } from "../../helpers/gradcheck.ts";
import { conv2d64, type ConvCase as Case } from "../../helpers/conv_reference.ts";
import { quantize, uniform } from "../../helpers/reference.ts";
import { assertClose, TOL, type Tolerance } from "../../helpers/assert.ts";
import { matmulSettings } from "../../../gpu/kernels/gemm/settings.ts";

function optionsOf(t: Case, bias: Tensor | null): Conv2dOptions {
  return {
    stride: t.stride,
    padding: t.padding,
    dilation: t.dilation,
    groups: t.groups,
    bias,
    activation: t.relu ? "relu" : "none",
  };
}

// H, W of 1, 7, 9 and 33; kernels 1, 3, 5, 3×1 and an even 4; strides 1 and 2; dilation 2;
// groups 2 and depthwise; padding 0, 1, 2 and "same"; both product orientations.
const CASES: Case[] = [
  { n: 2, c: 3, h: 7, w: 7, o: 4, k: [3, 3], padding: [1, 1], bias: true },
  { n: 1, c: 2, h: 9, w: 7, o: 3, k: [5, 5], stride: [2, 2], padding: [2, 2] },
  { n: 3, c: 4, h: 1, w: 1, o: 2, k: [1, 1], bias: true },
  { n: 2, c: 4, h: 9, w: 9, o: 6, k: [3, 3], padding: [2, 2], dilation: [2, 2], groups: 2 },
  { n: 2, c: 5, h: 9, w: 9, o: 5, k: [3, 3], stride: [2, 2], padding: [1, 1], groups: 5 },
  { n: 1, c: 3, h: 7, w: 33, o: 2, k: [3, 1], padding: [1, 0], bias: true, relu: true },
  { n: 2, c: 2, h: 7, w: 7, o: 3, k: [4, 4], padding: "same" },
  { n: 1, c: 2, h: 9, w: 9, o: 2, k: [3, 3], padding: "same", dilation: [2, 2], stride: [1, 1] },
  { n: 4, c: 8, h: 33, w: 33, o: 16, k: [3, 3], padding: [1, 1], bias: true, relu: true },
  { n: 2, c: 6, h: 9, w: 7, o: 4, k: [3, 3], stride: [2, 1], groups: 2, bias: true },
  // Fewer positions than channels: the products run untransposed (see transposeFor).
  { n: 1, c: 2, h: 3, w: 3, o: 16, k: [3, 3], bias: true },
  { n: 1, c: 16, h: 1, w: 2, o: 3, k: [1, 1], stride: [1, 2] },
];

// dweight and dbias are sums over every output position (up to 4356 terms of size ≤ ~3).
// bf16 results round to 8 significant bits (2⁻⁸ relative at worst).
const SUM_TOL: Record<FloatDType, Tolerance> = {
  f32: { atol: 1e-4, rtol: 1e-4 },
  f16: { atol: 2e-2, rtol: 3e-3 },
  bf16: { atol: 2e-2, rtol: 1e-2 },
};

const label = (t: Case) =>
  `${t.n}×${t.c}×${t.h}×${t.w} → ${t.o}, k ${t.k}, s ${t.stride ?? 1}, p ${t.padding ?? 0}, ` +
  `d ${t.dilation ?? 1}, g ${t.groups ?? 1}${t.bias ? ", bias" : ""}${t.relu ? ", relu" : ""}`;

/** Runs case `t` in `dtype` forward and backward and checks everything against f64. */
async function checkCase(t: Case, dtype: FloatDType, tiling: string): Promise<void> {
  const cg = t.c / (t.groups ?? 1);
  const x = quantize(uniform(t.n * t.c * t.h * t.w, 1, -1, 1), dtype);
  const w = quantize(uniform(t.o * cg * t.k[0] * t.k[1], 2, -0.5, 0.5), dtype);
  const b = t.bias ? quantize(uniform(t.o, 3, -0.5, 0.5), "f32") : null;
  const gy = quantize(uniform(conv2d64(x, w, b, null, t).y.length, 4), dtype);
  // Under ReLU the upstream gradient passes only where y > 0.
  const pre = conv2d64(x, w, b, null, t).y;
  const ref = conv2d64(x, w, b, t.relu ? gy.map((g, i) => (pre[i] > 0 ? g : 0)) : gy, t);
  const tx = Tensor.from(x, [t.n, t.c, t.h, t.w], { dtype, requiresGrad: true });
  const tw = Tensor.from(w, [t.o, cg, ...t.k], { dtype, requiresGrad: true });
  const tb = b ? Tensor.from(b, [t.o], { requiresGrad: true }) : null;
  const y = conv2d(tx, tw, optionsOf(t, tb));
  const what = `${label(t)} ${dtype} (${tiling})`;
  assert.deepEqual(y.shape, ref.shape, what);
  assert.equal(y.dtype, dtype);
  assertClose(
    await y.read(),
    t.relu ? ref.y.map((v) => Math.max(v, 0)) : ref.y,
    TOL[dtype],
    `y ${what}`,
  );
  y.backward({ gradient: Tensor.from(gy, ref.shape, { dtype }) });
  assertClose(await tx.grad!.read(), ref.dx, TOL[dtype], `dx ${what}`);
  assertClose(await tw.grad!.read(), ref.dw, SUM_TOL[dtype], `dweight ${what}`);
  if (tb) assertClose(await tb.grad!.read(), ref.db, SUM_TOL.f32, `dbias ${what}`);
  for (const tensor of [tx, tw, tb, y]) {
    tensor?.grad?.dispose();
    tensor?.dispose();
  }
}

Deno.test({
  name: "conv2d: forward, dx, dweight and dbias match f64 at odd shapes, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const t of CASES) {
      for (const dtype of DTYPES) await checkCase(t, dtype, "default tiling");
    }
  },
});

Deno.test({
  name:
    "conv2d: every matmul tiling candidate (register, interleaved, shared, blocked) computes the same",
  ...GPU_TEST,
  async fn() {
    const bf16Variants = new Set<string>();
    await withEachTiling(async (tiling) => {
      for (const t of [CASES[1], CASES[4], CASES[9]]) await checkCase(t, "f32", tilingName(tiling));
      // bf16 once per kind (each case compiles three kernels), with odd planes:
      // neighbouring threads store the two halves of a word.
      if (bf16Variants.has(tiling.variant)) return;
      bf16Variants.add(tiling.variant);
      await checkCase(CASES[4], "bf16", tilingName(tiling));
    });
  },
});

const matrixConfig = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);

Deno.test({
  name: "conv2d: in f16 on a subgroup-matrix tiling (tensor cores), forward, dx, dweight and " +
    "dbias match f64" +
    (matrixConfig ? "" : " (IGNORED: this adapter has no f16→f32 subgroup-matrix config; " +
      "run on the Dawn backend, HALFSTEP_BACKEND=dawn)"),
  ignore: matrixConfig === undefined,
  ...GPU_TEST,
  async fn() {
    // The smallest: each kernel compiles in seconds on lavapipe, and the three passes' gathers
    // (the GemmIo) are the same whatever the tile (tests/gpu/kernels/matmul_subgroup_matrix_test.ts runs each).
    const tiling = subgroupMatrixCandidates(gpu, "f16").reduce((
      a,
      b,
    ) => (a.tm * a.tn <= b.tm * b.tn ? a : b));
    await withTiling(tiling, async () => {
      // Stride, groups and bias, both orientations of the products (transposed and not).
      const keys = await dispatchedKernelsAsync(() =>
        checkCase(CASES[9], "f16", tilingName(tiling))
      );
      assert.ok(keys.some((k) => k.startsWith("conv2d_subgroup_matrix{")), keys.join(", "));
      await checkCase(CASES[10], "f16", tilingName(tiling));
    });
  },
});

Deno.test({
  name: "conv2d: gradients agree with finite differences (stride, dilation, groups, bias)",
  ...GPU_TEST,
  async fn() {
    const t: Case = {
      n: 2,
      c: 4,
      h: 7,
      w: 6,
      o: 2,
      k: [3, 2],
      stride: [2, 1],
      padding: [1, 1],
      dilation: [1, 2],
      groups: 2,
    };
    const weights = uniform(2 * 2 * 3 * 2 * 2 * 5 * 2, 9); // y's size for a fixed weighting
    await gradcheck(
      "conv2d",
      ([x, w, b]) => {
        const y = conv2d(x, w, { ...optionsOf(t, b) });
        return sum(mul(y, Tensor.from(weights.slice(0, y.size), y.shape)));
      },
      [uniform(2 * 4 * 7 * 6, 1), uniform(2 * 2 * 3 * 2, 2), uniform(2, 3)],
      [[2, 4, 7, 6], [2, 2, 3, 2], [2]],
    );
  },
});

Deno.test({
  name: "conv2d: bad input is a clear error naming the op, the shapes and what to do",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const x = Tensor.zeros([1, 4, 5, 5]);
      const w = Tensor.zeros([6, 2, 3, 3]);
      assert.throws(
        () => conv2d(x, Tensor.zeros([6, 3, 3, 3]), { groups: 3 }),
        /conv2d: input channels 4 and output channels 6 must both divide by groups 3/,
      );
      assert.throws(
        () => conv2d(x, w),
        /conv2d: weight has 2 input channels per group but the input gives 4 \/ 1 groups = 4/,
      );
      assert.throws(
        () => conv2d(x, Tensor.zeros([2, 4, 7, 7])),
        /conv2d: the kernel spans 7×7 .* but the padded input is 5×5 .*pad more or use a smaller kernel/,
      );
      assert.throws(
        () => conv2d(Tensor.zeros([4, 5, 5]), w, { groups: 2 }),
        /conv2d: input must be \[N, C, H, W\] \(got input f32 \[4, 5, 5\].*add a batch axis/,
      );
      assert.throws(
        () => conv2d(x, w, { groups: 2, stride: 0 }),
        /conv2d: stride must be a positive integer or a pair \[height, width\] of them, got 0/,
      );
      assert.throws(
        () => conv2d(x, w, { groups: 2, padding: "same", stride: 2 }),
        /conv2d: padding "same" needs stride 1/,
      );
      assert.throws(
        () => conv2d(x, w, { groups: 2, bias: Tensor.zeros([5]) }),
        /conv2d: bias f32 \[5\] must be \[6\]/,
      );
      assert.throws(
        () => conv2d(x, Tensor.zeros([6, 2, 3, 3], { dtype: "f16" }), { groups: 2 }),
        /conv2d: dtypes differ/,
      );
    });
  },
});

/** The weight gradient of case `t` in `dtype` (x needs none: only that pass runs) against f64. */
async function checkWeightGrad(t: Case, dtype: FloatDType, what: string): Promise<void> {
  const groups = t.groups ?? 1;
  const x = quantize(uniform(t.n * t.c * t.h * t.w, 1, -1, 1), dtype);
  const w = quantize(uniform(t.o * (t.c / groups) * t.k[0] * t.k[1], 2, -0.5, 0.5), dtype);
  const shape = conv2d64(x, w, null, null, t).shape;
  const gy = quantize(uniform(shape.reduce((a, b) => a * b, 1), 4), dtype);
  const ref = conv2d64(x, w, null, gy, t);
  const tw = Tensor.from(w, [t.o, t.c / groups, ...t.k], { dtype, requiresGrad: true });
  const tx = Tensor.from(x, [t.n, t.c, t.h, t.w], { dtype });
  const gradient = Tensor.from(gy, shape, { dtype });
  // The weight gradient's pass is followed by the sum of its slices.
  const keys = dispatchedKernels(() => {
    const y = conv2d(tx, tw, optionsOf(t, null));
    y.backward({ gradient });
    y.dispose();
  });
  const pass = keys.findIndex((k) => k.includes("weight_grad"));
  assert.match(keys[pass + 1] ?? "", /^reduce/, `${what}: ${keys.join(", ")}`);
  assertClose(await tw.grad!.read(), ref.dw, SUM_TOL[dtype], `dweight ${what} ${dtype}`);
  for (const tensor of [tw.grad!, tw, tx, gradient]) tensor.dispose();
}

Deno.test({
  name: "conv2d: as on a GPU, the weight gradient is split with an uneven last slice and " +
    "matches f64 under every blocked tiling, f32, f16 and bf16, grouped",
  ...GPU_TEST,
  async fn() {
    // 1500 and 1026 positions: the weight gradient's reduction, split into 5 and 4 slices.
    const cases: Case[] = [
      { n: 3, c: 4, h: 25, w: 20, o: 6, k: [3, 3], padding: [1, 1] },
      { n: 2, c: 4, h: 27, w: 19, o: 4, k: [3, 3], padding: [1, 1], groups: 2 },
    ];
    await asGpu(async () => {
      const chosen = matmulSettings.of(gpu).tiling;
      try {
        for (const tiling of MATMUL_CANDIDATES.filter((t) => t.variant === "blocked")) {
          matmulSettings.of(gpu).tiling = tiling;
          for (const [i, t] of cases.entries()) {
            const groups = t.groups ?? 1;
            const size = { m: t.o / groups, n: (t.c / groups) * 9, k: t.n * t.h * t.w };
            const split = gemmSplit(gpu, tiling, size, groups);
            const last = size.k - (split.slices - 1) * split.length;
            const what = `${tilingName(tiling)} tk ${tiling.tk}, case ${i}`;
            assert.ok(split.slices > 1 && last < split.length, `${what}: ${JSON.stringify(split)}`);
            await checkWeightGrad(t, "f32", what);
            if (gpu.f16 && i === 0) await checkWeightGrad(t, "f16", what);
            if (i === 1) await checkWeightGrad(t, "bf16", what);
          }
        }
      } finally {
        matmulSettings.of(gpu).tiling = chosen;
      }
    });
  },
});
