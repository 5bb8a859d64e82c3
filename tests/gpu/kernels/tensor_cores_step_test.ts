/**
 * The f16 step on subgroup matrices end to end: the chunked linear
 * cross-entropy (a GPT's head and loss) with every product forced onto the
 * subgroup-matrix tilings, against f64; and a tiny GPT's AMP steps with
 * `matmulTiling` and `attentionPlan` both `"subgroup-matrix"` (every f16
 * product and the attention forward and backward on subgroup matrices)
 * against the same model's steps on Deno's own WebGPU with the default
 * kernels, over 3 steps.
 *
 * They need an adapter with an f16→f32 subgroup-matrix config: the Dawn
 * backend (Mesa 26's lavapipe, 8×8×8); elsewhere they are ignored, saying so.
 */
import assert from "node:assert/strict";
import { AmpTrainer, type Gpu, initGpu, linearCrossEntropy, SGD, Tensor } from "../../../mod.ts";
import { setDefaultGpu } from "../../../gpu/mod.ts";
import { subgroupMatrixCandidates } from "../../../gpu/kernels/gemm/candidates.ts";
import { f16MatrixConfig } from "../../helpers/internals.ts";
import { dispatchedKernelsAsync, gpu, GPU_TEST, withTiling } from "../../helpers/gpu.ts";
import { requireMatricesOnDawn } from "../../helpers/dawn_pass.ts";
import { assertClose } from "../../helpers/assert.ts";
import { crossEntropy64, matmul64, quantize, uniform } from "../../helpers/reference.ts";
import { Gpt } from "../../../models/mod.ts";

const config = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);
/** Appended to each test's name where it cannot run. */
const CANNOT_RUN = config ? "" : " (IGNORED: this adapter has no f16→f32 subgroup-matrix " +
  "config; run on the Dawn backend, HALFSTEP_BACKEND=dawn)";
const DAWN_TEST = { ...GPU_TEST, ignore: !config } as const;

Deno.test({
  name: "tensor cores: the chunked linear cross-entropy on subgroup matrices (loss, dh, dW) " +
    "matches f64" + CANNOT_RUN,
  ...DAWN_TEST,
  async fn() {
    const rows = 33, features = 24, classes = 515, chunkRows = 7;
    const h = quantize(uniform(rows * features, 1, -1, 1), "f16");
    const w = quantize(uniform(classes * features, 2, -1, 1), "f16");
    const targets = Array.from(uniform(rows, 3, 0, classes), Math.floor);
    // f64: logits = h·Wᵀ, the summed loss, and its gradients through the logits.
    const logits = matmul64(h, w, {
      batch: 1,
      m: rows,
      n: classes,
      k: features,
      transA: false,
      transB: true,
    });
    const ce = crossEntropy64(logits, targets, classes, {
      smoothing: 0,
      weight: null,
      reduction: "sum",
    });
    const dh = matmul64(ce.grad, w, {
      batch: 1,
      m: rows,
      n: features,
      k: classes,
      transA: false,
      transB: false,
    });
    const dw = matmul64(ce.grad, h, {
      batch: 1,
      m: classes,
      n: features,
      k: rows,
      transA: true,
      transB: false,
    });
    // The smallest candidate (every one is checked against f64 by matmul_subgroup_matrix_test.ts;
    // lavapipe compiles each config in seconds).
    for (const tiling of subgroupMatrixCandidates(gpu, "f16").slice(-1)) {
      const th = Tensor.from(h, [rows, features], { dtype: "f16", requiresGrad: true });
      const tw = Tensor.from(w, [classes, features], { dtype: "f16", requiresGrad: true });
      let got: Float32Array[] = [];
      const kernels = await withTiling(tiling, () =>
        dispatchedKernelsAsync(async () => {
          const loss = linearCrossEntropy(th, tw, targets, { reduction: "sum", chunkRows });
          loss.backward();
          got = [await loss.read(), await th.grad!.read(), await tw.grad!.read()].map((a) =>
            Float32Array.from(a)
          );
          loss.dispose();
        }));
      const products = kernels.filter((k) => k.startsWith("matmul"));
      assert.ok(
        products.length >= 3 && products.every((k) => k.startsWith("matmul_subgroup_matrix")),
        `every product on subgroup matrices: ${products.join(", ")}`,
      );
      // The logits are f16 (half-ulp 2⁻¹¹ of |logit| ≤ 24): the loss of 33 rows within 33 × 0.012;
      // dh and dW are f16 results of f32 sums of f16 dlogits (|dlogit| ≤ 1) times |h|, |w| ≤ 1.
      assertClose(got[0], [ce.loss.reduce((a, b) => a + b, 0)], { atol: 0.4, rtol: 2e-3 }, "loss");
      assertClose(got[1], dh, { atol: 4e-3, rtol: 4e-3 }, `${tiling.tm}: dh`);
      assertClose(got[2], dw, { atol: 4e-3, rtol: 4e-3 }, `${tiling.tm}: dW`);
      for (const t of [th, tw, th.grad, tw.grad]) t?.dispose();
    }
  },
});

/** Three AMP steps of a tiny GPT on `device` (fixed init and batches): the losses and the weights. */
async function threeSteps(device: Gpu): Promise<{ losses: number[]; weights: Float32Array[] }> {
  setDefaultGpu(device);
  const model = new Gpt({ vocab: 37, context: 16, layers: 2, dim: 32, heads: 2, seed: 4 });
  // SGD: updates in proportion to the gradients. (Adam turns a gradient that is zero but for
  // rounding, the key bias's under softmax's shift invariance, into a full step of either sign.)
  const optimizer = new SGD(model.parameters(), { lr: 0.1, momentum: 0.9 });
  const trainer = new AmpTrainer(model, optimizer, { maxGradNorm: 1 });
  const losses: number[] = [];
  for (let step = 0; step < 3; step++) {
    const ids = Array.from({ length: 2 * 16 }, (_, i) => (i * 7 + step * 3) % 37);
    const x = Tensor.from(ids, [2, 16], { dtype: "i32" });
    const y = Tensor.from(ids.map((v) => (v * 5 + 1) % 37), [32], { dtype: "i32" });
    const loss = trainer.step(() => model.loss(x, y));
    losses.push(await loss.item());
    for (const t of [x, y, loss]) t.dispose();
  }
  const weights = await Promise.all(
    model.parameters().map(async (p) => Float32Array.from(await p.read())),
  );
  for (const thing of [trainer, optimizer, model]) thing.dispose();
  return { losses, weights };
}

Deno.test({
  name:
    "tensor cores: a tiny GPT's AMP steps with matmulTiling and attentionPlan 'subgroup-matrix' " +
    "equal Deno's own WebGPU's default kernels over 3 steps" + CANNOT_RUN,
  ...DAWN_TEST,
  async fn() {
    const matrices = await initGpu({
      backend: "dawn",
      matmulTiling: "subgroup-matrix",
      attentionPlan: "subgroup-matrix",
      setDefault: false,
    });
    const builtin = await initGpu({
      backend: "builtin",
      matmulTiling: "default",
      setDefault: false,
    });
    try {
      const a = await threeSteps(matrices);
      const b = await threeSteps(builtin);
      const built = [...matrices.pipelines.entries()].map((k) => k.key.split("{")[0]);
      for (
        const family of [
          "matmul_subgroup_matrix",
          "flash_attention_subgroup_matrix_forward",
          "flash_attention_subgroup_matrix_dq",
          "flash_attention_subgroup_matrix_dkv",
        ]
      ) assert.ok(built.includes(family), `the step ran ${family}`);
      // f16 products either way; the kernels' summation orders and f16 roundings differ (and the
      // subgroup-matrix backward rounds dS to f16), so losses agree to f16's few ulps and the
      // weights after 3 SGD steps (lr 0.1) to a few ulps of f16 gradients times the step.
      assertClose(a.losses, b.losses, { atol: 5e-3, rtol: 2e-3 }, "losses");
      a.weights.forEach((w, i) =>
        assertClose(w, b.weights[i], { atol: 3e-3, rtol: 1e-2 }, `param ${i}`)
      );
    } finally {
      setDefaultGpu(gpu);
      matrices.destroy();
      builtin.destroy();
    }
  },
});

requireMatricesOnDawn("tensor cores step", config !== undefined);
