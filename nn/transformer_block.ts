/** The pre-LayerNorm decoder block of GPT-2: causal self-attention and an MLP, each residual. */
import { add, type Tensor, ValueError } from "../gpu/mod.ts";
import { CausalSelfAttention, type CausalSelfAttentionOptions } from "./attention.ts";
import { generatorOf, type ParameterOptions } from "./init.ts";
import { Linear } from "./linear.ts";
import { Module } from "./module.ts";
import { LayerNorm } from "./normalization.ts";

/** Options of {@link TransformerBlock}. */
export interface TransformerBlockOptions extends ParameterOptions {
  /** Hidden size of the MLP as a multiple of the model size (default 4). */
  mlpRatio?: number;
  /**
   * GELU form of the MLP: `"none"` (default) is the exact erf form, PyTorch's
   * `nn.GELU()` and nanoGPT's; `"tanh"` is GPT-2's approximation ("gelu_new",
   * PyTorch's `approximate="tanh"`).
   */
  gelu?: "none" | "tanh";
  /**
   * Biases in the four projections and the two LayerNorms (default true;
   * nanoGPT's `bias`, false in its training config).
   */
  bias?: boolean;
  /**
   * The attention's options: `fused` (default true, the fused op) and
   * `dropout` on the attention weights (default 0).
   */
  attention?: Pick<CausalSelfAttentionOptions, "fused" | "dropout">;
}

/**
 * x ← x + attention(norm1(x)); x ← x + fc2(gelu(fc1(norm2(x)))), with x
 * [B, T, C]. Under autocast the projections run in f16 while the residual
 * stream keeps the dtype it came in with (f32 from an fp32 embedding), and
 * LayerNorm keeps f32 statistics. Parameters: `norm1.*`, `attention.*`,
 * `norm2.*`, `fc1.*`, `fc2.*`.
 *
 * Every intermediate is disposed as soon as it is consumed (the tape keeps
 * what backward needs), so the block works as a checkpointed segment too:
 * `new Checkpointed(block)` or a `Sequential` of blocks with `checkpoint` set.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Tensor, TransformerBlock } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const block = new TransformerBlock(8, 2, { seed: 1 });
 * const x = Tensor.from(Array.from({ length: 24 }, (_, i) => i / 24), [1, 3, 8]);
 * const y = block.forward(x); // x: [batch, T, 8] → [batch, T, 8]
 * assert.equal(y.shape.join(), "1,3,8");
 * gpu.destroy();
 * ```
 */
export class TransformerBlock extends Module {
  /** LayerNorm before the attention. */
  readonly norm1: LayerNorm;
  /** Causal multi-head self-attention. */
  readonly attention: CausalSelfAttention;
  /** LayerNorm before the MLP. */
  readonly norm2: LayerNorm;
  /** MLP expansion, C → ratio·C. */
  readonly fc1: Linear;
  /** MLP projection back, ratio·C → C. */
  readonly fc2: Linear;
  /** GELU form of the MLP. */
  readonly geluApproximate: "none" | "tanh";

  /** A block over `dim` features with `heads` attention heads. */
  constructor(dim: number, heads: number, options: TransformerBlockOptions = {}) {
    super();
    const hidden = Math.round((options.mlpRatio ?? 4) * dim);
    if (!(hidden > 0)) {
      throw new ValueError(`TransformerBlock: mlpRatio must be positive, got ${options.mlpRatio}.`);
    }
    this.geluApproximate = options.gelu ?? "none";
    if (this.geluApproximate !== "none" && this.geluApproximate !== "tanh") {
      throw new ValueError(
        `TransformerBlock: gelu must be "none" or "tanh", not ${JSON.stringify(options.gelu)}.`,
      );
    }
    const init = { ...options, seed: generatorOf(options.seed) };
    const norm = { gpu: options.gpu, bias: options.bias };
    this.norm1 = this.registerModule("norm1", new LayerNorm(dim, norm));
    this.attention = this.registerModule(
      "attention",
      new CausalSelfAttention(dim, heads, { ...init, ...options.attention }),
    );
    this.norm2 = this.registerModule("norm2", new LayerNorm(dim, norm));
    this.fc1 = this.registerModule("fc1", new Linear(dim, hidden, init));
    // fc2 applies the GELU itself and recomputes it in backward: the block
    // keeps fc1's output for backward, not also its GELU.
    this.fc2 = this.registerModule(
      "fc2",
      new Linear(hidden, dim, { ...init, geluInput: this.geluApproximate }),
    );
  }

  /** x [B, T, C] → [B, T, C]. */
  forward(x: Tensor): Tensor {
    // Each LayerNorm runs inside the projection after it, which keeps the
    // residual stream (held anyway) rather than the normalised rows.
    const a = this.attention.forward(x, this.norm1);
    const x1 = add(x, a);
    a.dispose();
    const h = this.fc1.forwardNormalized(x1, this.norm2);
    const m = this.fc2.forward(h);
    h.dispose();
    const y = add(x1, m);
    x1.dispose();
    m.dispose();
    return y;
  }
}
