/**
 * The tiny GPT of `tiny_gpt.ts`: a decoder-only transformer over character
 * ids, built from the public API only.
 *
 * Memory layout for ids [B, T], model size C, vocabulary V, L blocks:
 *
 * ```
 * tokens.forward(ids)     [B, T, C]   f32 (the fp32 table; embeddings are on no autocast list)
 * + positions [T, C]      [B, T, C]   broadcast over the batch: the residual stream, f32
 * L × TransformerBlock    [B, T, C]   inside: projections f16 under autocast, scores [B·H, T, T]
 * norm                    [B, T, C]   f32 statistics
 * head                    [B·T, V]    logits (f16 under autocast; cross-entropy runs in f32)
 * ```
 *
 * @module
 */
import {
  add,
  Embedding,
  LayerNorm,
  Linear,
  Module,
  RandomGenerator,
  reshape,
  Sequential,
  Tensor,
  TransformerBlock,
} from "../mod.ts";

/** Sizes of a {@link TinyGpt}. */
export interface TinyGptConfig {
  /** Characters in the vocabulary. */
  vocab: number;
  /** Longest sequence (size of the position table). */
  context: number;
  /** Transformer blocks. */
  layers: number;
  /** Model size C. */
  dim: number;
  /** Attention heads (must divide `dim`). */
  heads: number;
  /** Seed of every initial value (default 0). */
  seed?: number;
  /** Fused attention (default true) or the reference path of matmuls and a saved softmax. */
  fusedAttention?: boolean;
}

/**
 * Token and position embeddings, `layers` pre-LN blocks, a final LayerNorm and a linear head.
 *
 * @example
 * ```ts ignore
 * const model = new TinyGpt({ vocab: 27, context: 32, layers: 2, dim: 64, heads: 4 });
 * model.blocks.checkpoint = 2; // optional: recompute each block in backward
 * const loss = crossEntropy(model.forward(ids), targets); // ids: i32 [batch, 32]
 * ```
 */
export class TinyGpt extends Module {
  /** The sizes it was built with. */
  readonly config: TinyGptConfig;
  /** Token embedding [V, C]. */
  readonly tokens: Embedding;
  /** Position embedding [context, C]. */
  readonly positions: Embedding;
  /**
   * The blocks. `blocks.checkpoint = layers` checkpoints each block (it keeps
   * only its input and recomputes its activations in backward; gradients are
   * unchanged).
   */
  readonly blocks: Sequential;
  /** Final LayerNorm. */
  readonly norm: LayerNorm;
  /** Logits head, C → V. */
  readonly head: Linear;

  /** A model of the given sizes, initialised from `config.seed`. */
  constructor(config: TinyGptConfig) {
    super();
    this.config = config;
    const seed = new RandomGenerator(config.seed ?? 0);
    const { vocab, context, dim, heads } = config;
    this.tokens = this.registerModule("tokens", new Embedding(vocab, dim, { seed }));
    this.positions = this.registerModule("positions", new Embedding(context, dim, { seed }));
    const blocks = Array.from(
      { length: config.layers },
      () => new TransformerBlock(dim, heads, { seed, attention: { fused: config.fusedAttention } }),
    );
    this.blocks = this.registerModule("blocks", new Sequential(...blocks));
    this.norm = this.registerModule("norm", new LayerNorm(dim));
    this.head = this.registerModule("head", new Linear(dim, vocab, { seed }));
  }

  /** ids (i32 [B, T], T ≤ context) → logits [B·T, V]. */
  forward(ids: Tensor): Tensor {
    const [b, t] = ids.shape;
    if (ids.rank !== 2 || ids.dtype !== "i32" || t > this.config.context) {
      throw new RangeError(
        `TinyGpt: ids must be i32 [batch, T] with T <= ${this.config.context}; got ${ids.describe()}.`,
      );
    }
    const positions = Tensor.from(Array.from({ length: t }, (_, i) => i), [t], { dtype: "i32" });
    const tok = this.tokens.forward(ids), pos = this.positions.forward(positions);
    const x = add(tok, pos); // [B, T, C] + [T, C]
    for (const u of [positions, tok, pos]) u.dispose();
    const h = this.blocks.forward(x);
    x.dispose();
    const flat = reshape(h, [b * t, this.config.dim]);
    h.dispose();
    // The final LayerNorm runs inside the head (one activation fewer kept, no cast under AMP).
    const logits = this.head.forwardNormalized(flat, this.norm);
    flat.dispose();
    return logits;
  }
}
