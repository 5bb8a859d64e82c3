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
  concat,
  crossEntropy,
  Embedding,
  keep,
  LayerNorm,
  Linear,
  linear,
  linearCrossEntropy,
  Module,
  RandomGenerator,
  reshape,
  Sequential,
  split,
  Tensor,
  TransformerBlock,
  ValueError,
} from "../mod.ts";

/** Sizes of a {@link Gpt}. */
export interface GptConfig {
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
  /** Dropout on the attention weights while training (default 0; nanoGPT's `dropout`). */
  dropout?: number;
  /**
   * The head uses the token table as its weight (default false): one
   * parameter, `tokens.weight` and `head.weight` in the state dict, as
   * nanoGPT's `wte` / `lm_head`.
   */
  tieEmbeddings?: boolean;
  /** A bias in the head (default true; nanoGPT's `lm_head` has none). */
  headBias?: boolean;
  /** Biases in the blocks' projections and in every LayerNorm (default true; nanoGPT's `bias`). */
  bias?: boolean;
  /** The MLP's GELU: `"none"` (default) exact, PyTorch's and nanoGPT's; `"tanh"` GPT-2's. */
  gelu?: "none" | "tanh";
  /**
   * The token table in this many pieces along its columns (default 1), each
   * [vocab, dim / tableShards] within one buffer of the adapter (GPT-2's
   * 50257 × 768 f32 table is over WebGPU's default 128 MiB). Piece 0 is
   * `tokens.weight`, the rest `tokenShards.{i}.weight`. Needs
   * `tieEmbeddings` and no head bias.
   */
  tableShards?: number;
}

/**
 * Token and position embeddings, `layers` pre-LN blocks, a final LayerNorm and a linear head.
 *
 * @example
 * ```ts ignore
 * const model = new Gpt({ vocab: 27, context: 32, layers: 2, dim: 64, heads: 4 });
 * model.blocks.checkpoint = 2; // optional: recompute each block in backward
 * const loss = crossEntropy(model.forward(ids), targets); // ids: i32 [batch, 32]
 * ```
 */
export class Gpt extends Module {
  /** The sizes it was built with. */
  readonly config: GptConfig;
  /** Token embedding [V, C] (its first column piece [V, C / tableShards] when sharded). */
  readonly tokens: Embedding;
  /** The token table's other column pieces (none unless `tableShards` > 1). */
  readonly tokenShards: Embedding[];
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
  /** Logits head, C → V (tied: over the first column piece when the table is sharded). */
  readonly head: Linear;
  /** Columns of each piece of the token table. */
  readonly #pieces: number[];
  /**
   * The position ids 0 … T − 1 by T, uploaded once: an upload inside a step
   * would make the batch submit what it recorded before it.
   */
  readonly #positionIds = new Map<number, Tensor>();

  /** A model of the given sizes, initialised from `config.seed`. */
  constructor(config: GptConfig) {
    super();
    this.config = config;
    const seed = new RandomGenerator(config.seed ?? 0);
    const { vocab, context, dim, heads, bias, gelu } = config;
    const shards = config.tableShards ?? 1;
    const tied = config.tieEmbeddings && config.headBias === false;
    if (!Number.isInteger(shards) || shards < 1 || dim % shards !== 0 || (shards > 1 && !tied)) {
      throw new ValueError(
        `Gpt: tableShards (${shards}) must divide dim (${dim}), and pieces need ` +
          "tieEmbeddings with headBias false.",
      );
    }
    this.#pieces = Array.from({ length: shards }, () => dim / shards);
    this.tokens = this.registerModule("tokens", new Embedding(vocab, dim / shards, { seed }));
    this.tokenShards = Array.from(
      { length: shards - 1 },
      () => new Embedding(vocab, dim / shards, { seed }),
    );
    if (shards > 1) this.registerModule("tokenShards", new Sequential(...this.tokenShards));
    this.positions = this.registerModule("positions", new Embedding(context, dim, { seed }));
    const attention = { fused: config.fusedAttention, dropout: config.dropout };
    const blocks = Array.from(
      { length: config.layers },
      () => new TransformerBlock(dim, heads, { seed, attention, bias, gelu }),
    );
    this.blocks = this.registerModule("blocks", new Sequential(...blocks));
    this.norm = this.registerModule("norm", new LayerNorm(dim, { bias }));
    const weight = config.tieEmbeddings ? this.tokens.weight : undefined;
    this.head = this.registerModule(
      "head",
      new Linear(dim / shards, vocab, { seed, weight, bias: config.headBias }),
    );
  }

  /** Frees the parameters and the position ids it keeps. */
  override dispose(): void {
    for (const t of this.#positionIds.values()) t.dispose();
    this.#positionIds.clear();
    super.dispose();
  }

  /** The token table's column pieces: `[tokens.weight]` unless the table is sharded. */
  tableWeights(): Tensor[] {
    return [this.tokens.weight, ...this.tokenShards.map((e) => e.weight)];
  }

  /** ids [B, T] → their token embeddings [B, T, C] (the pieces joined). */
  embed(ids: Tensor): Tensor {
    if (this.tokenShards.length === 0) return this.tokens.forward(ids);
    const parts = [this.tokens, ...this.tokenShards].map((e) => e.forward(ids));
    const out = concat(parts, -1);
    for (const t of parts) t.dispose();
    return out;
  }

  /** The last block's rows [N, C] → logits [N, V]: the final LayerNorm and the head. */
  headLogits(rows: Tensor): Tensor {
    // The final LayerNorm runs inside the head (one activation fewer kept, no cast under AMP).
    if (this.tokenShards.length === 0) return this.head.forwardNormalized(rows, this.norm);
    const normed = this.norm.forward(rows);
    const parts = split(normed, this.#pieces, -1);
    normed.dispose();
    let logits = this.head.forward(parts[0]);
    this.tokenShards.forEach((e, i) => {
      const part = linear(parts[i + 1], e.weight);
      const sum = add(logits, part);
      for (const t of [logits, part]) t.dispose();
      logits = sum;
    });
    for (const t of parts) t.dispose();
    return logits;
  }

  /** ids (i32 [B, T], T ≤ context) → logits [B·T, V]. */
  forward(ids: Tensor): Tensor {
    const flat = this.#trunk(ids);
    const logits = this.headLogits(flat);
    flat.dispose();
    return logits;
  }

  /**
   * The mean cross-entropy of the model's next-token predictions for ids
   * (i32 [B, T]) against `targets` (B·T ids). Without a head bias the head
   * and the loss run fused in chunks of rows (`linearCrossEntropy`): the
   * logits [B·T, V], a GPT-2 step's largest tensor, are never whole.
   */
  loss(
    ids: Tensor,
    targets: Tensor | ArrayLike<number>,
    options: { chunkRows?: number } = {},
  ): Tensor {
    if (this.head.bias) return crossEntropy(this.forward(ids), targets);
    const flat = this.#trunk(ids);
    const rows = this.norm.forward(flat);
    flat.dispose();
    const pieces = this.tokenShards.length === 0 ? [rows] : split(rows, this.#pieces, -1);
    const loss = linearCrossEntropy(pieces, this.tableWeights(), targets, options);
    for (const t of new Set([rows, ...pieces])) t.dispose();
    return loss;
  }

  /** ids [B, T] → the last block's output [B·T, C], before the final LayerNorm. */
  #trunk(ids: Tensor): Tensor {
    const [b, t] = ids.shape;
    if (ids.rank !== 2 || ids.dtype !== "i32" || t > this.config.context) {
      throw new RangeError(
        `Gpt: ids must be i32 [batch, T] with T <= ${this.config.context}; got ${ids.describe()}.`,
      );
    }
    let positions = this.#positionIds.get(t);
    if (!positions || positions.disposed) {
      const values = Array.from({ length: t }, (_, i) => i);
      // Kept: an enclosing tidy() does not free it.
      positions = keep(Tensor.from(values, [t], { dtype: "i32", gpu: ids.gpu }));
      this.#positionIds.set(t, positions);
    }
    const tok = this.embed(ids), pos = this.positions.forward(positions);
    const x = add(tok, pos); // [B, T, C] + [T, C]
    for (const u of [tok, pos]) u.dispose();
    const h = this.blocks.forward(x);
    x.dispose();
    const flat = reshape(h, [b * t, this.config.dim]);
    h.dispose();
    return flat;
  }
}
