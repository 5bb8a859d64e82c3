/**
 * Causal multi-head self-attention: the functional core (`causalAttention`)
 * and the layer with its four projections (`CausalSelfAttention`).
 *
 * Memory layout, for x [B, T, C] with H heads of size D = C / H:
 *
 * ```
 * q, k, v      [B, T, C]    projections (Linear, f16 under autocast)
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
import { ShapeError, ValueError } from "../gpu/errors.ts";
import { causalSoftmax } from "../gpu/ops/causal_softmax.ts";
import { matmul } from "../gpu/ops/matmul.ts";
import { permute } from "../gpu/ops/permute.ts";
import { reshape } from "../gpu/ops/reshape.ts";
import type { Tensor } from "../gpu/tensor.ts";
import { generatorOf, type ParameterOptions } from "./init.ts";
import { Linear } from "./linear.ts";
import { Module } from "./module.ts";

/** Options of {@link causalAttention}. */
export interface CausalAttentionOptions {
  /** Number of heads; must divide the feature size. */
  heads: number;
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
 * concatenated back to [B, T, C]. The two products are batched matmuls (f16
 * under autocast, f32 accumulation); the softmax is f32 math inside.
 *
 * @example
 * ```ts
 * import { causalAttention, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const q = Tensor.zeros([1, 3, 4]), k = Tensor.zeros([1, 3, 4]); // [batch, T, C]
 * const v = Tensor.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 3, 4]);
 * const y = causalAttention(q, k, v, { heads: 2 }); // [batch, T, C]: two heads of size 2
 * const out = await y.read();
 * console.assert(out.slice(0, 4).join() === "1,2,3,4"); // query 0 sees only key 0
 * gpu.destroy();
 * ```
 */
export function causalAttention(
  q: Tensor,
  k: Tensor,
  v: Tensor,
  options: CausalAttentionOptions,
): Tensor {
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
  const probs = causalSoftmax(scores, { scale: 1 / Math.sqrt(d) });
  scores.dispose();
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
  /** Biases in the four projections (default true). */
  bias?: boolean;
}

/**
 * Causal multi-head self-attention as in GPT: x [B, T, C] → query, key and
 * value projections (Linear C→C each), {@link causalAttention} over `heads`
 * heads, then the output projection (Linear C→C). Parameters are named
 * `query.*`, `key.*`, `value.*` and `output.*`.
 *
 * NOTE: q, k and v come from three projections rather than one fused
 * Linear(C, 3C) followed by a split: halfstep has no slicing op yet, and the
 * three weights are exactly the rows of a fused one.
 *
 * @example
 * ```ts
 * import { CausalSelfAttention, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const attention = new CausalSelfAttention(8, 2, { seed: 1 });
 * const x = Tensor.from(Array.from({ length: 24 }, (_, i) => i / 24), [1, 3, 8]);
 * const y = attention.forward(x); // x: [batch, T, 8] → [batch, T, 8]
 * console.assert(y.shape.join() === "1,3,8");
 * gpu.destroy();
 * ```
 */
export class CausalSelfAttention extends Module {
  /** Number of heads. */
  readonly heads: number;
  /** Query projection. */
  readonly query: Linear;
  /** Key projection. */
  readonly key: Linear;
  /** Value projection. */
  readonly value: Linear;
  /** Output projection. */
  readonly output: Linear;

  /** Attention over `dim` features in `heads` heads (`heads` must divide `dim`). */
  constructor(dim: number, heads: number, options: CausalSelfAttentionOptions = {}) {
    super();
    if (!Number.isInteger(heads) || heads < 1 || dim % heads !== 0) {
      throw new ValueError(
        `CausalSelfAttention: heads (${heads}) must be a positive integer that divides dim (${dim}).`,
      );
    }
    this.heads = heads;
    // One generator for all four, so they start different and reproducible.
    const init = { ...options, seed: generatorOf(options.seed) };
    this.query = this.registerModule("query", new Linear(dim, dim, init));
    this.key = this.registerModule("key", new Linear(dim, dim, init));
    this.value = this.registerModule("value", new Linear(dim, dim, init));
    this.output = this.registerModule("output", new Linear(dim, dim, init));
  }

  /** x [B, T, C] → [B, T, C]; position i attends to positions 0..i. */
  forward(x: Tensor): Tensor {
    const q = this.query.forward(x), k = this.key.forward(x), v = this.value.forward(x);
    const a = causalAttention(q, k, v, { heads: this.heads });
    for (const t of [q, k, v]) t.dispose();
    const y = this.output.forward(a);
    a.dispose();
    return y;
  }
}
