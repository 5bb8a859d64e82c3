/**
 * The benchmark FLOP formulas (examples/bench/flops.ts) against counts written out
 * by hand, and against the FLOPs the kernels of one real training step report.
 */
import assert from "node:assert/strict";
import { crossEntropy, noGrad, sum, Tensor, tidy } from "../../mod.ts";
import {
  causalAttentionFlops,
  gptStepFlops,
  mnistStepFlops,
  reportedFlops,
} from "../../examples/bench/flops.ts";
import { mnistInputShape, mnistModel } from "../../examples/mnist/model.ts";
import { Gpt } from "../../models/mod.ts";
import { gptConfig } from "../../examples/bench/gpt.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { uniform } from "../helpers/reference.ts";

Deno.test("FLOP formulas: the MNIST MLP, CNN and causal GPT match counts by hand", () => {
  const b = 64;
  const mlp = 2 * b * 784 * 256 + // layer 1 forward
    2 * b * 784 * 256 + // layer 1 dW (no dx: the pixels need no gradient)
    3 * 2 * b * 256 * 256 + // layer 2 forward, dW, dx
    3 * 2 * b * 256 * 10; // layer 3 forward, dW, dx
  assert.equal(mnistStepFlops("mlp", b), mlp);
  // The old hard-coded 6·B·weights was 33% high: it counted layer 1's dx.
  assert.equal(6 * b * (784 * 256 + 256 * 256 + 256 * 10) / mlp, 806400 / 605696);

  const cnn = 2 * 2 * b * 32 * 26 * 26 * 1 * 9 + // conv1 (1→32, 3×3, 26×26 out) forward, dW; no dx
    3 * 2 * b * 64 * 11 * 11 * 32 * 9 + // conv2 (32→64, 3×3, 11×11 out) forward, dW, dx
    3 * 2 * b * 1600 * 10; // linear 1600 → 10 forward, dW, dx
  assert.equal(mnistStepFlops("cnn", b), cnn);

  // Causal attention, T = 3, D = 2: row i scores keys 0..i, 1 + 2 + 3 = 6 pairs per head.
  // Per pair: q·k, p·v forward; dO·v, p·dO, ds·k, ds·q backward: 6 products of D, 2 FLOPs each.
  assert.equal(
    causalAttentionFlops({ batch: 2, heads: 3, t: 3, headSize: 2 }),
    2 * 3 * 6 * 6 * 2 * 2,
  );

  const g = gptConfig("real"); // 6 layers, dim 384, 6 heads, context 256, batch 64, vocab 65
  const rows = 64 * 256, c = 384;
  const perLayer = 6 * rows * c * 3 * c + // qkv C→3C: forward, dW, dx (2·rows·C·3C each)
    6 * rows * c * c + // attention output C→C
    6 * rows * c * 4 * c + // MLP C→4C
    6 * rows * 4 * c * c + // MLP 4C→C
    12 * 64 * 6 * (256 * 257 / 2) * 64; // attention: B·H heads, T(T+1)/2 pairs, 6 products of D = 64
  const gpt = 6 * perLayer + 6 * rows * c * 65; // + the head C→V; embeddings are gathers
  assert.equal(gptStepFlops(g), gpt);
  // The old formula (6·all parameters·tokens + full T×T attention) was ~6% high here.
  const parameters = 6 * (12 * c * c + 13 * c) + 65 * c + 256 * c + 2 * c + c * 65 + 65;
  const old = 6 * parameters * rows + 3 * 2 * 2 * 6 * rows * 256 * c;
  assert.ok(old / gpt > 1.04 && old / gpt < 1.08, `old / true = ${old / gpt}`);
});

/** FLOPs the kernels of `loss`'s forward (and backward when `train`) report. */
function reported(loss: () => Tensor, train = true): number {
  return reportedFlops(gpu, () => {
    const l = train ? tidy(loss) : noGrad(() => tidy(loss));
    if (train) l.backward();
    l.dispose();
  });
}

Deno.test({
  name: "FLOP formulas: equal what the kernels of one training step report",
  ...GPU_TEST,
  fn() {
    const b = 3, y = Tensor.from([1, 7, 3], [b], { dtype: "i32" });
    const data = (shape: number[]) => Tensor.from(uniform(shape.reduce((n, d) => n * d), 2), shape);
    // The MLP's products are matmuls, which report exactly 2·m·n·k: no dx for layer 1.
    const mlp = mnistModel("mlp", 1), pixels = data(mnistInputShape("mlp", b));
    assert.equal(reported(() => crossEntropy(mlp.forward(pixels), y)), mnistStepFlops("mlp", b));
    // The CNN's forward kernels report its products exactly; backward, conv2d's kernels
    // report what they run, more than the products: the input gradient scores every input
    // pixel against all k² taps (padding included) and split-K pads its slices.
    const cnn = mnistModel("cnn", 1), images = data(mnistInputShape("cnn", b));
    const cnnLoss = () => crossEntropy(cnn.forward(images), y);
    const forward = 2 * b * 32 * 26 * 26 * 9 + 2 * b * 64 * 11 * 11 * 32 * 9 + 2 * b * 1600 * 10;
    assert.equal(reported(cnnLoss, false), forward);
    assert.ok(reported(cnnLoss) >= mnistStepFlops("cnn", b));
    for (const t of [y, mlp, pixels, cnn, images]) t.dispose();

    const g = { vocab: 11, context: 9, layers: 2, dim: 16, heads: 2, batch: 2, seed: 1 };
    const model = new Gpt(g);
    const ids = Tensor.from(Array.from({ length: 18 }, (_, i) => i % 11), [2, 9], { dtype: "i32" });
    // The fused attention kernels report no FLOPs: everything else must match.
    const attention = g.layers * causalAttentionFlops({ batch: 2, heads: 2, t: 9, headSize: 8 });
    assert.equal(reported(() => sum(model.forward(ids))), gptStepFlops(g) - attention);
    ids.dispose();
    model.dispose();
  },
});
