/** Differentiable fused causal attention: no T×T matrix in memory, forward or backward. */
import { record } from "../autograd.ts";
import { autocastInputs } from "../autocast_hook.ts";
import { DTypeError, fail, ShapeError, ValueError } from "../errors.ts";
import {
  type AttentionDropout,
  launchFlashAttention,
  launchFlashAttentionBackward,
  MAX_HEAD_SIZE,
} from "../kernels/flash_attention.ts";
import type { RandomRange } from "../random.ts";
import type { Tensor } from "../tensor.ts";

/** Options of {@link fusedCausalAttention}. */
export interface FusedCausalAttentionOptions {
  /** Number of heads H; must divide the feature size C = H·D. */
  heads: number;
  /**
   * Dropout on the attention weights (PyTorch's `dropout_p`): drop
   * probability `p` and a random range of B·H·T·T numbers (from
   * `generator.take(...)`). The mask is regenerated from the range in
   * backward, never stored.
   */
  dropout?: { p: number; range: RandomRange };
}

/** Counters one dropout mask may use: (b·H + h)·T·T + i·T + j must fit a u32. */
const MAX_DROPOUT_ENTRIES = 2 ** 32;

/**
 * Causal multi-head attention of `q` over `k` and `v`, each [B, T, H·D], as
 * one fused op: for every batch and head, softmax(q·kᵀ/√D) with query i
 * seeing keys 0..i, times v, heads concatenated back to [B, T, H·D]. Heads
 * are read by strides (no permute copies), the softmax is online in f32, and
 * only the output and one f32 log-sum-exp per row are kept for backward, so
 * memory is linear in T; backward recomputes the probabilities.
 *
 * Under autocast the op (`"fused_attention"`, on the f16 list) casts q, k and
 * v to f16 and returns f16; its statistics and sums are f32 inside. Inputs
 * and output must share one float dtype. The head size D may be at most 256.
 *
 * @example
 * ```ts
 * import { fusedCausalAttention, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const q = Tensor.zeros([1, 3, 4]), k = Tensor.zeros([1, 3, 4]); // [batch, T, H·D]
 * const v = Tensor.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 3, 4]);
 * const y = fusedCausalAttention(q, k, v, { heads: 2 }); // two heads of size 2
 * const out = await y.read();
 * console.assert(out.slice(0, 4).join() === "1,2,3,4"); // query 0 sees only key 0
 * console.assert(out[4] === 3); // query 1 averages keys 0 and 1 (equal scores)
 * gpu.destroy();
 * ```
 */
export function fusedCausalAttention(
  q0: Tensor,
  k0: Tensor,
  v0: Tensor,
  options: FusedCausalAttentionOptions,
): Tensor {
  const [q, k, v] = autocastInputs("fused_attention", [q0, k0, v0]);
  const shape = checkedShape(q, k, v, options.heads);
  const dropout = checkedDropout(options.dropout, shape);
  const { o, lse } = launchFlashAttention(q, k, v, shape, dropout);
  const out = record({
    op: "fused_attention",
    inputs: [q, k, v],
    output: o,
    save: [q, k, v, o, lse],
    backward: (g, [sq, sk, sv, so, slse]) =>
      launchFlashAttentionBackward({ q: sq, k: sk, v: sv, o: so, lse: slse }, g, shape, dropout),
  });
  lse.dispose();
  return out;
}

function checkedShape(q: Tensor, k: Tensor, v: Tensor, heads: number) {
  const where = "fusedCausalAttention";
  const same = [k, v].every((t) => t.rank === 3 && t.shape.every((e, i) => e === q.shape[i]));
  if (q.rank !== 3 || !same) {
    fail(
      ShapeError,
      where,
      `q, k and v must all be [batch, T, heads·headSize]; got ${q.describe()}, ` +
        `${k.describe()} and ${v.describe()}.`,
    );
  }
  if (q.dtype === "i32" || k.dtype !== q.dtype || v.dtype !== q.dtype) {
    fail(
      DTypeError,
      where,
      `q, k and v must share one float dtype; got ${q.describe()}, ${k.describe()} and ` +
        `${v.describe()}. Cast them first (or run under autocast).`,
    );
  }
  const [batch, t, c] = q.shape;
  if (!Number.isInteger(heads) || heads < 1 || c % heads !== 0) {
    fail(
      ShapeError,
      where,
      `heads (${heads}) must be a positive integer that divides the ${c} features of ` +
        `${q.describe()}.`,
    );
  }
  const headSize = c / heads;
  if (headSize > MAX_HEAD_SIZE) {
    fail(
      ShapeError,
      where,
      `head size ${headSize} (${c} features / ${heads} heads) is above the fused kernel's limit ` +
        `of ${MAX_HEAD_SIZE}; use more heads, or causalAttention(..., { fused: false }).`,
    );
  }
  return { batch, t, heads, headSize };
}

function checkedDropout(
  dropout: FusedCausalAttentionOptions["dropout"],
  s: { batch: number; t: number; heads: number },
): AttentionDropout | null {
  if (dropout === undefined || dropout.p === 0) return null;
  const where = "fusedCausalAttention";
  if (!(dropout.p >= 0 && dropout.p < 1)) {
    fail(ValueError, where, `dropout p must be in [0, 1), got ${dropout.p}.`);
  }
  const entries = s.batch * s.heads * s.t * s.t;
  if (dropout.range.counter + entries > MAX_DROPOUT_ENTRIES) {
    fail(
      ShapeError,
      where,
      `attention dropout numbers each of the batch·heads·T·T = ${entries} weights with a 32-bit ` +
        `counter, and the range given starts at ${dropout.range.counter}: at most ` +
        `${MAX_DROPOUT_ENTRIES} fit. Take the range as generator.take(${entries}), or split the batch.`,
    );
  }
  return dropout;
}
