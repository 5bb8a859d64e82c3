/**
 * Causal multi-head self-attention: the functional core (`causalAttention`)
 * and the layer with its fused q/k/v projection (`CausalSelfAttention`).
 *
 * By default the core is the fused op (`fusedCausalAttention`: no T×T matrix,
 * memory linear in T). The reference path (`fused: false`), kept for tests
 * and comparison, is built from matmuls and a causal softmax. Its memory
 * layout, for x [B, T, C] with H heads of size D = C / H:
 *
 * ```
 * q, k, v      [B, T, C]    projections (Linear, f16 or bf16 under autocast)
 * qh, kh, vh   [B·H, T, D]  heads split: reshape [B, T, H, D] → permute → [B, H, T, D] → reshape
 * scores       [B·H, T, T]  qh·khᵀ (matmul, transB)       freed at once: not saved
 * probs        [B·H, T, T]  causal softmax of scores/√D    saved (its backward and probs·vh need it)
 * o            [B·H, T, D]  probs·vh, merged back to [B, T, C]
 * ```
 *
 * Saved for backward: qh and kh (scores' matmul), probs and vh (the output
 * matmul); nothing else. Intermediates are disposed as soon as the next op
 * has consumed them, so the forward pass never holds scores and probs at once
 * longer than one op.
 */
import {
  causalSoftmax,
  dropout,
  fusedCausalAttention,
  fusedCausalAttentionPacked,
  type LayerNormOptions,
  matmul,
  permute,
  type RandomGenerator,
  type RandomRange,
  reshape,
  ShapeError,
  split,
  type Tensor,
  ValueError,
} from "../gpu/mod.ts";
import { generatorOf, type ParameterOptions } from "./init.ts";
import { Linear } from "./linear.ts";
import { type HostTensor, isHostTensor, Module, type StateValue } from "./module.ts";

/** Options of {@link causalAttention}. */
export interface CausalAttentionOptions {
  /** Number of heads; must divide the feature size. */
  heads: number;
  /**
   * The fused op (default true: `fusedCausalAttention`, memory linear in T)
   * or the reference path of matmuls and a saved T×T softmax (false).
   */
  fused?: boolean;
  /**
   * Dropout on the attention weights: probability `p` and a random range of
   * batch·heads·T·T numbers. Both paths number the weights the same way, so
   * the same range gives the same mask on either.
   */
  dropout?: { p: number; range: RandomRange };
}

/** [B, T, H·D] → [B·H, T, D] (a copy, unless H = 1, where the layouts agree). */
function splitHeads(x: Tensor, heads: number): Tensor {
  const [b, t, c] = x.shape, d = c / heads;
  if (heads === 1) return reshape(x, [b, t, d]);
  const x4 = reshape(x, [b, t, heads, d]);
  const p = permute(x4, [0, 2, 1, 3]);
  x4.dispose();
  const out = reshape(p, [b * heads, t, d]);
  p.dispose();
  return out;
}

/** [B·H, T, D] → [B, T, H·D], the inverse of {@link splitHeads}. */
function mergeHeads(o: Tensor, b: number, heads: number): Tensor {
  const [, t, d] = o.shape;
  if (heads === 1) return reshape(o, [b, t, d]);
  const o4 = reshape(o, [b, heads, t, d]);
  const p = permute(o4, [0, 2, 1, 3]);
  o4.dispose();
  const out = reshape(p, [b, t, heads * d]);
  p.dispose();
  return out;
}

/**
 * Causal multi-head attention of `q` over `k` and `v`, all [B, T, C] with C
 * split into `options.heads` heads of size D: for each batch and head,
 * softmax(q·kᵀ/√D) with query i seeing keys 0..i, times v; the heads are
 * concatenated back to [B, T, C]. By default this is `fusedCausalAttention`;
 * with `fused: false` the two products are batched matmuls (f16 or bf16
 * under autocast, f32 accumulation) around a causal softmax (f32 math inside).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { causalAttention, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const q = Tensor.zeros([1, 3, 4]), k = Tensor.zeros([1, 3, 4]); // [batch, T, C]
 * const v = Tensor.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 3, 4]);
 * const y = causalAttention(q, k, v, { heads: 2 }); // [batch, T, C]: two heads of size 2
 * const out = await y.read();
 * assert.equal(out.slice(0, 4).join(), "1,2,3,4"); // query 0 sees only key 0
 * gpu.destroy();
 * ```
 */
export function causalAttention(
  q: Tensor,
  k: Tensor,
  v: Tensor,
  options: CausalAttentionOptions,
): Tensor {
  if (options.fused ?? true) return fusedCausalAttention(q, k, v, options);
  const heads = options.heads;
  const c = q.shape[2];
  const same = [k, v].every((t) => t.rank === 3 && t.shape.every((e, i) => e === q.shape[i]));
  if (q.rank !== 3 || !same) {
    throw new ShapeError(
      `causalAttention: q, k and v must all be [batch, T, features]; got ${q.describe()}, ` +
        `${k.describe()} and ${v.describe()}.`,
    );
  }
  if (!Number.isInteger(heads) || heads < 1 || c % heads !== 0) {
    throw new ShapeError(
      `causalAttention: heads (${heads}) must be a positive integer that divides the ` +
        `${c} features of ${q.describe()}.`,
    );
  }
  const b = q.shape[0], d = c / heads;
  const qh = splitHeads(q, heads), kh = splitHeads(k, heads);
  const scores = matmul(qh, kh, { transB: true }); // [B·H, T, T]
  qh.dispose();
  kh.dispose();
  let probs = causalSoftmax(scores, { scale: 1 / Math.sqrt(d) });
  scores.dispose();
  if (options.dropout && options.dropout.p > 0) {
    // probs is [B·H, T, T] row-major: element (z, i, j) takes counter + (z·T + i)·T + j, as the fused op.
    const kept = dropout(probs, options.dropout.p, options.dropout.range);
    probs.dispose();
    probs = kept;
  }
  const vh = splitHeads(v, heads);
  const o = matmul(probs, vh); // [B·H, T, D]
  probs.dispose();
  vh.dispose();
  const out = mergeHeads(o, b, heads);
  o.dispose();
  return out;
}

/** Options of {@link CausalSelfAttention}. */
export interface CausalSelfAttentionOptions extends ParameterOptions {
  /** Biases in the two projections (default true). */
  bias?: boolean;
  /** The fused attention op (default true) or the reference path (false); see {@link causalAttention}. */
  fused?: boolean;
  /**
   * Dropout probability on the attention weights in training mode (default
   * 0; PyTorch's `dropout_p`, nanoGPT's `attn_dropout`). Masks come from the
   * layer's `generator`, seeded from `seed`.
   */
  dropout?: number;
}

/**
 * Causal multi-head self-attention as in GPT: x [B, T, C] → one fused
 * projection to q, k and v (Linear C→3C; the fused attention reads the three
 * from its output by strides, the reference path `split`s it), attention
 * over `heads` heads, then the output projection
 * (Linear C→C). Parameters are named `qkv.*` (rows: the query, key and value
 * weights in that order, as nanoGPT's `c_attn`) and `output.*` (`c_proj`).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { CausalSelfAttention, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const attention = new CausalSelfAttention(8, 2, { seed: 1 });
 * const x = Tensor.from(Array.from({ length: 24 }, (_, i) => i / 24), [1, 3, 8]);
 * const y = attention.forward(x); // x: [batch, T, 8] → [batch, T, 8]
 * assert.equal(y.shape.join(), "1,3,8");
 * gpu.destroy();
 * ```
 */
export class CausalSelfAttention extends Module {
  /** Number of heads. */
  readonly heads: number;
  /** The query, key and value projections as one Linear C→3C. */
  readonly qkv: Linear;
  /** Output projection. */
  readonly output: Linear;
  /** Whether the fused attention op runs. */
  readonly fused: boolean;
  /** Dropout probability on the attention weights (training mode only). */
  readonly dropout: number;
  /** Where the attention-dropout masks come from. */
  readonly generator: RandomGenerator;

  /** Attention over `dim` features in `heads` heads (`heads` must divide `dim`). */
  constructor(dim: number, heads: number, options: CausalSelfAttentionOptions = {}) {
    super();
    if (!Number.isInteger(heads) || heads < 1 || dim % heads !== 0) {
      throw new ValueError(
        `CausalSelfAttention: heads (${heads}) must be a positive integer that divides dim (${dim}).`,
      );
    }
    const p = options.dropout ?? 0;
    if (!(p >= 0 && p < 1)) {
      throw new ValueError(`CausalSelfAttention: dropout must be in [0, 1), got ${p}.`);
    }
    this.heads = heads;
    this.fused = options.fused ?? true;
    this.dropout = p;
    // One generator for both projections and the masks, so everything is reproducible.
    this.generator = generatorOf(options.seed);
    const init = { ...options, seed: this.generator };
    this.qkv = this.registerModule("qkv", new Linear(dim, 3 * dim, init));
    this.output = this.registerModule("output", new Linear(dim, dim, init));
  }

  /**
   * Loads halfstep 0.1 files, whose attention had three projections: their
   * `query`, `key` and `value` weights (and biases) are stacked by rows into
   * `qkv`, exactly the fused projection's layout.
   */
  protected override upgradeState(state: Map<string, StateValue>, prefix: string): void {
    for (const kind of ["weight", "bias"]) {
      const parts = ["query", "key", "value"].map((p) => state.get(`${prefix}${p}.${kind}`));
      const fused = `${prefix}qkv.${kind}`;
      if (state.has(fused) || !parts.every((t) => t && isHostTensor(t))) continue;
      const [q, k, v] = parts as HostTensor[];
      const sameLayout = [k, v].every((t) =>
        t.dtype === q.dtype && t.shape.length === q.shape.length &&
        t.shape.every((e, i) => e === q.shape[i])
      );
      if (!sameLayout || q.shape.length === 0) continue; // left as is: the check names them
      const data = new Uint8Array(3 * q.data.byteLength);
      [q, k, v].forEach((t, i) => data.set(t.data, i * q.data.byteLength));
      state.set(fused, { dtype: q.dtype, shape: [3 * q.shape[0], ...q.shape.slice(1)], data });
      for (const p of ["query", "key", "value"]) state.delete(`${prefix}${p}.${kind}`);
    }
  }

  /**
   * x [B, T, C] → [B, T, C]; position i attends to positions 0..i. With
   * `norm` (a LayerNorm module will do), the layer attends over
   * `layerNorm(x, norm)`, normalising inside the projection so that backward
   * keeps x rather than the normalised rows (see `layerNormLinear`).
   */
  forward(x: Tensor, norm?: LayerNormOptions): Tensor {
    const c = x.shape.at(-1) ?? 0;
    const qkv = norm ? this.qkv.forwardNormalized(x, norm) : this.qkv.forward(x);
    const [b, t] = x.shape;
    const dropout = this.training && this.dropout > 0
      ? { p: this.dropout, range: this.generator.take(b * this.heads * t * t) }
      : undefined;
    let a: Tensor;
    if (this.fused) {
      // The fused op reads q, k and v from the projection's output by strides: no split.
      a = fusedCausalAttentionPacked(qkv, { heads: this.heads, dropout });
    } else {
      const [q, k, v] = split(qkv, [c, c, c], -1);
      a = causalAttention(q, k, v, { heads: this.heads, fused: false, dropout });
      for (const u of [q, k, v]) u.dispose();
    }
    qkv.dispose();
    const y = this.output.forward(a);
    a.dispose();
    return y;
  }
}
