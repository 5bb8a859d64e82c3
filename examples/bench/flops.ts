/**
 * Training FLOPs of the examples' models, counted from what the kernels
 * compute, in one place (benchmarks and reports divide them by time).
 *
 * Counted: the products — matmul, conv2d and attention — at 2 FLOPs per
 * multiply-add, as the matmul and conv2d kernels report them to the profiler
 * (`bench ops` sums those). Elementwise ops, norms, softmax statistics,
 * reductions and the optimizer are left out (a few percent at most).
 * Backward computes every weight gradient, and an input gradient only where
 * the input needs one: a first layer's input is data (pixels, or embedding
 * rows gathered by index), so that product is never run. Work that repeats
 * a forward (checkpoint recompute, the fused attention backward rescoring
 * q·kᵀ) is not counted: the figure is the model's work, the same with and
 * without checkpointing.
 *
 * @module
 */
import type { Gpu } from "../../mod.ts";
import type { GptConfig } from "../../models/gpt.ts";
import type { MnistModel } from "../mnist/model.ts";

/**
 * The FLOPs the kernels of `fn`'s dispatches report (what the profiler and
 * `bench ops` add up: matmul and conv2d; attention kernels report none).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, matmul, Tensor } from "../../mod.ts";
 * import { reportedFlops } from "./flops.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const a = Tensor.zeros([2, 3]), b = Tensor.zeros([3, 4]);
 * assert.equal(reportedFlops(gpu, () => matmul(a, b).dispose()), 2 * 2 * 3 * 4);
 * gpu.destroy();
 * ```
 */
export function reportedFlops(gpu: Gpu, fn: () => void): number {
  const batch = gpu.batch, dispatch = batch.dispatch;
  let flops = 0;
  batch.dispatch = (kernel, buffers, words, workgroups, cost = {}) => {
    flops += cost.flops ?? 0;
    dispatch.call(batch, kernel, buffers, words, workgroups, cost);
  };
  try {
    fn();
  } finally {
    batch.dispatch = dispatch;
  }
  return flops;
}

/**
 * A linear layer over `rows` inputs: forward x·Wᵀ, backward gᵀ·x (dW) and,
 * when `inputGrad`, g·W (dx); 2·rows·in·out each.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { linearFlops } from "./flops.ts";
 * assert.equal(linearFlops(1, 2, 3, { inputGrad: false }), 24);
 * ```
 */
export function linearFlops(
  rows: number,
  inFeatures: number,
  outFeatures: number,
  options: { inputGrad: boolean },
): number {
  return 2 * rows * inFeatures * outFeatures * (options.inputGrad ? 3 : 2);
}

/** Sizes of one 2-d convolution (unit stride, no groups: what the examples run). */
export interface ConvFlopsShape {
  /** Batch N. */
  batch: number;
  /** Input channels C. */
  inChannels: number;
  /** Output channels O. */
  outChannels: number;
  /** Kernel side k. */
  kernel: number;
  /** Output height × width. */
  outPixels: number;
  /** Whether backward computes the input's gradient (false for the first layer). */
  inputGrad: boolean;
}

/**
 * A convolution: forward, weight gradient and (when `inputGrad`) input
 * gradient are each 2·N·O·pixels·C·k² (the im2col product conv2d runs).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { conv2dFlops } from "./flops.ts";
 * const shape = { batch: 1, inChannels: 1, outChannels: 1, kernel: 3, outPixels: 4, inputGrad: true };
 * assert.equal(conv2dFlops(shape), 3 * 2 * 4 * 9);
 * ```
 */
export function conv2dFlops(s: ConvFlopsShape): number {
  const product = 2 * s.batch * s.outChannels * s.outPixels * s.inChannels * s.kernel ** 2;
  return product * (s.inputGrad ? 3 : 2);
}

/**
 * Causal attention over B·H heads of size D: row i scores keys 0..i, so a
 * head has T(T+1)/2 (query, key) pairs, not T². Per pair and per head
 * element: forward q·k and p·v (2 products), backward dp = dO·v, dv += p·dO,
 * dq += ds·k and dk += ds·q (4 products); 2 FLOPs each.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { causalAttentionFlops } from "./flops.ts";
 * // T = 2: pairs (0,0), (1,0), (1,1); 6 products of D = 4 each; 2 FLOPs per multiply-add.
 * assert.equal(causalAttentionFlops({ batch: 1, heads: 1, t: 2, headSize: 4 }), 3 * 6 * 4 * 2);
 * ```
 */
export function causalAttentionFlops(
  s: { batch: number; heads: number; t: number; headSize: number },
): number {
  const pairs = (s.t * (s.t + 1)) / 2;
  return 2 * 6 * s.batch * s.heads * pairs * s.headSize;
}

/**
 * One training step of the MNIST model on `batch` images (see
 * examples/mnist/model.ts for the layers).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { mnistStepFlops } from "./flops.ts";
 * assert.ok(mnistStepFlops("mlp", 1) < mnistStepFlops("cnn", 1));
 * ```
 */
export function mnistStepFlops(model: MnistModel, batch: number): number {
  if (model === "mlp") {
    // 784-256-256-10; the pixels need no gradient.
    return linearFlops(batch, 784, 256, { inputGrad: false }) +
      linearFlops(batch, 256, 256, { inputGrad: true }) +
      linearFlops(batch, 256, 10, { inputGrad: true });
  }
  // conv 1→32 3×3 (28 → 26), pool (13), conv 32→64 3×3 (13 → 11), pool (5), linear 1600 → 10.
  return conv2dFlops({
    batch,
    inChannels: 1,
    outChannels: 32,
    kernel: 3,
    outPixels: 26 * 26,
    inputGrad: false,
  }) +
    conv2dFlops({
      batch,
      inChannels: 32,
      outChannels: 64,
      kernel: 3,
      outPixels: 11 * 11,
      inputGrad: true,
    }) +
    linearFlops(batch, 64 * 5 * 5, 10, { inputGrad: true });
}

/**
 * One training step of the GPT benchmark's model: per block the C→3C, C→C,
 * C→4C and 4C→C projections and causal attention, then the C→V head; every
 * product's input needs a gradient (the embeddings train). The embeddings
 * are gathers, no products: their parameters are not in the count.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { gptStepFlops } from "./flops.ts";
 * const g = { vocab: 65, context: 64, layers: 2, dim: 128, heads: 4, batch: 8, seed: 1 };
 * assert.ok(gptStepFlops(g) > 0);
 * ```
 */
export function gptStepFlops(
  g: Pick<GptConfig, "vocab" | "context" | "layers" | "dim" | "heads"> & { batch: number },
): number {
  const rows = g.batch * g.context, c = g.dim, grad = { inputGrad: true };
  const block = linearFlops(rows, c, 3 * c, grad) + linearFlops(rows, c, c, grad) +
    linearFlops(rows, c, 4 * c, grad) + linearFlops(rows, 4 * c, c, grad) +
    causalAttentionFlops({ batch: g.batch, heads: g.heads, t: g.context, headSize: c / g.heads });
  return g.layers * block + linearFlops(rows, c, g.vocab, grad);
}
