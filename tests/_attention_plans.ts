/**
 * Helpers of the fused attention tests: forcing a plan, the dropout mask's
 * factors, and one forward and backward on the GPU.
 */
import { backward, causalAttention, fusedCausalAttentionPacked, Tensor } from "../mod.ts";
import {
  type AttentionPlan,
  DTYPES,
  type FloatDType,
  type RandomRange,
  randomUniform,
} from "../gpu/mod.ts";
import { dispatchedKernels, gpu } from "./_gpu.ts";
import { attentionSettings } from "../gpu/kernels/attention/settings.ts";
import type { AttentionDims } from "./_attention_reference.ts";

/**
 * Runs `fn` with each dtype's attention plan set to `plan` and no per-shape
 * picks, then restores the tuned ones.
 */
export async function withPlan(plan: AttentionPlan, fn: () => Promise<void>): Promise<void> {
  const { plans, shapes } = attentionSettings.of(gpu);
  const tuned = new Map(plans), picks = new Map(shapes.picks);
  try {
    for (const dtype of DTYPES) plans.set(dtype, plan);
    shapes.picks.clear();
    await fn();
  } finally {
    plans.clear();
    shapes.picks.clear();
    for (const [dtype, p] of tuned) plans.set(dtype, p);
    for (const [key, p] of picks) shapes.picks.set(key, p);
  }
}

/** The dropout factor of weight (z, i, j), from the mask's definition (see gpu/tensor/random.ts). */
export function dropoutFactor(
  p: number,
  range: RandomRange,
  t: number,
): (z: number, i: number, j: number) => number {
  return (z, i, j) =>
    randomUniform(range.key, range.counter + (z * t + i) * t + j) >= p ? 1 / (1 - p) : 0;
}

/** q, k, v and the output's gradient g, each [B, T, H·D] values. */
export type AttentionValues = Record<"q" | "k" | "v" | "g", Float64Array>;

/** The output and the gradients of q, k and v, as read back. */
export type AttentionResults = Record<"o" | "dq" | "dk" | "dv", Float32Array>;

/** How {@link runAttention} calls attention. */
export interface AttentionRunOptions {
  /** The fused op (default) or matmul + causal softmax. */
  fused?: boolean;
  /** q, k, v side by side in one [B, T, 3·H·D] tensor (`fusedCausalAttentionPacked`). */
  packed?: boolean;
  /** Dropout on the attention weights. */
  dropout?: { p: number; range: RandomRange };
}

/**
 * Causal attention of `x` (stored in `dtype`) forward, and backward from
 * `x.g`, on the GPU with the current plan: the output and the three
 * gradients read back (a packed gradient cut into its thirds), and the
 * kernel key of every dispatch.
 */
export async function runAttention(
  x: AttentionValues,
  dims: AttentionDims,
  dtype: FloatDType,
  options: AttentionRunOptions = {},
): Promise<{ out: AttentionResults; kernels: string[] }> {
  const shape = [dims.b, dims.t, dims.h * dims.d], c = dims.h * dims.d, rows = dims.b * dims.t;
  const { fused = true, packed = false, dropout } = options;
  const g = Tensor.from(x.g, shape, { dtype });
  const inputs = packed
    ? [
      Tensor.from(sideBySide([x.q, x.k, x.v], c), [dims.b, dims.t, 3 * c], {
        dtype,
        requiresGrad: true,
      }),
    ]
    : [x.q, x.k, x.v].map((a) => Tensor.from(a, shape, { dtype, requiresGrad: true }));
  let o = g;
  const kernels = dispatchedKernels(() => {
    const [q, k, v] = inputs;
    o = packed
      ? fusedCausalAttentionPacked(q, { heads: dims.h, dropout })
      : causalAttention(q, k, v, { heads: dims.h, fused, dropout });
    backward(o, { gradient: g });
  });
  const read = async (t: Tensor) => Float32Array.from(await t.read()); // float results
  const grads = await Promise.all(inputs.map((t) => read(t.grad!)));
  const [dq, dk, dv] = packed ? [0, 1, 2].map((n) => third(grads[0], c, rows, n)) : grads;
  const out = { o: await read(o), dq, dk, dv };
  for (const t of [...inputs, g, o]) t.dispose();
  return { out, kernels };
}

/** Rows of q, k and v (each `c` wide) side by side: row r is q[r], k[r], v[r]. */
function sideBySide(parts: Float64Array[], c: number): Float64Array {
  const rows = parts[0].length / c, packed = new Float64Array(rows * 3 * c);
  parts.forEach((part, n) => {
    for (let r = 0; r < rows; r++) packed.set(part.subarray(r * c, (r + 1) * c), (3 * r + n) * c);
  });
  return packed;
}

/** Third `n` (q, k or v) of each row of a packed [rows, 3c] gradient. */
function third(packed: Float32Array, c: number, rows: number, n: number): Float32Array {
  const out = new Float32Array(rows * c);
  for (let r = 0; r < rows; r++) {
    out.set(packed.subarray((3 * r + n) * c, (3 * r + n + 1) * c), r * c);
  }
  return out;
}
