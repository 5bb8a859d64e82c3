/** Differentiable fused causal attention: no T×T matrix in memory, forward or backward. */
import { record } from "../tensor/autograd.ts";
import { autocastInputs } from "../tensor/autocast_hook.ts";
import { DTypeError, fail, ShapeError, ValueError } from "../base/errors.ts";
import {
  type AttentionDropout,
  type AttentionInputs,
  type FlashAttentionShape,
  launchFlashAttention,
  launchFlashAttentionBackward,
  MAX_HEAD_SIZE,
} from "../kernels/attention/flash_attention.ts";
import type { RandomRange } from "../kernels/wgsl/random.ts";
import { Tensor } from "../tensor/tensor.ts";

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
 * v to the autocast dtype (f16 or bf16) and returns it; its statistics and
 * sums are f32 inside. Inputs and output must share one float dtype (f32,
 * f16 or bf16). The head size D may be at most 256.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { fusedCausalAttention, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const q = Tensor.zeros([1, 3, 4]), k = Tensor.zeros([1, 3, 4]); // [batch, T, H·D]
 * const v = Tensor.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 3, 4]);
 * const y = fusedCausalAttention(q, k, v, { heads: 2 }); // two heads of size 2
 * const out = await y.read();
 * assert.equal(out.slice(0, 4).join(), "1,2,3,4"); // query 0 sees only key 0
 * assert.equal(out[4], 3); // query 1 averages keys 0 and 1 (equal scores)
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
  const shape = checkedShape(where, q, q.shape[2], options.heads);
  return attention({ q, k, v }, [q, k, v], shape, checkedDropout(options.dropout, shape));
}

/**
 * {@link fusedCausalAttention} of q, k and v given side by side in one
 * [B, T, 3·H·D] tensor (q in the first third of each row, then k, then v), as
 * a fused C→3C projection writes them: the kernels read each by strides and
 * backward writes one [B, T, 3·H·D] gradient, so nothing is split or copied.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { fusedCausalAttentionPacked, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const qkv = Tensor.from(Array.from({ length: 24 }, (_, i) => i / 24), [1, 2, 12]); // C = 4
 * const y = fusedCausalAttentionPacked(qkv, { heads: 2 }); // [batch, T, C]
 * assert.equal(y.shape.join(), "1,2,4");
 * gpu.destroy();
 * ```
 */
export function fusedCausalAttentionPacked(
  qkv0: Tensor,
  options: FusedCausalAttentionOptions,
): Tensor {
  const [qkv] = autocastInputs("fused_attention", [qkv0]);
  const where = "fusedCausalAttentionPacked";
  if (qkv.rank !== 3 || qkv.shape[2] % 3 !== 0) {
    fail(
      ShapeError,
      where,
      `qkv must be [batch, T, 3·heads·headSize] (q, k and v side by side); got ${qkv.describe()}.`,
    );
  }
  if (qkv.dtype === "i32") {
    fail(DTypeError, where, `qkv must be f32, f16 or bf16; got ${qkv.describe()}.`);
  }
  const shape = checkedShape(where, qkv, qkv.shape[2] / 3, options.heads);
  return attention({ qkv }, [qkv], shape, checkedDropout(options.dropout, shape));
}

/** The differentiable op on checked inputs: one node; gradients come in the inputs' layout. */
function attention(
  inputs: AttentionInputs,
  list: Tensor[],
  shape: FlashAttentionShape,
  dropout: AttentionDropout | null,
): Tensor {
  const launched = launchFlashAttention(inputs, shape, dropout);
  const o = Tensor.adopt(launched.o), lse = Tensor.adopt(launched.lse);
  const out = record({
    op: "fused_attention",
    inputs: list,
    output: o,
    save: [...list, o, lse],
    backward: (g, saved) => {
      const [sq, sk, sv] = saved, [so, slse] = saved.slice(-2);
      const again: AttentionInputs = "qkv" in inputs ? { qkv: sq } : { q: sq, k: sk, v: sv };
      return launchFlashAttentionBackward({ inputs: again, o: so, lse: slse }, g, shape, dropout)
        .map(Tensor.adopt);
    },
  });
  lse.dispose();
  return out;
}

/** The sizes, with a clear error for heads that do not divide the `c` features or a head too large. */
function checkedShape(where: string, x: Tensor, c: number, heads: number): FlashAttentionShape {
  const [batch, t] = x.shape;
  if (!Number.isInteger(heads) || heads < 1 || c % heads !== 0) {
    fail(
      ShapeError,
      where,
      `heads (${heads}) must be a positive integer that divides the ${c} features of ` +
        `${x.describe()}.`,
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
