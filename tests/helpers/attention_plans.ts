/**
 * Helpers of the fused attention tests: forcing a plan, the dropout mask's
 * factors, and one forward and backward on the GPU.
 */
import { backward, causalAttention, fusedCausalAttentionPacked, Tensor } from "../../mod.ts";
import {
  type AttentionPlan,
  DTYPES,
  type FloatDType,
  RandomGenerator,
  type RandomRange,
  randomUniform,
} from "../../gpu/mod.ts";
import { dispatchedKernels, gpu } from "./gpu.ts";
import { assertClose, type Tolerance } from "./assert.ts";
import { quantize, uniform } from "./reference.ts";
import { attentionSettings } from "../../gpu/kernels/attention/settings.ts";
import { type AttentionDims, causalAttentionWithGrads64 } from "./attention_reference.ts";

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

/**
 * f16 inputs are exact in f32 and so are their products; scores, softmax
 * and sums are f32, so the error is the f16 roundings: of p before P·V
 * (half-ulp 2⁻¹¹ ≈ 4.9e-4 relative, over a convex combination of v: at
 * most that of |v| ≤ 2), of the output (the same) and, in the gradients, of
 * the stored o inside δ = dO·O; as the SIMT plans' f16 tolerance
 * (fused_attention_tiled_test.ts). With scores of ±1000 (|q|, |k| ≤ 32) the
 * gradients reach 9, where f16's half-ulp is 2⁻⁸ ≈ 3.9e-3, and are sums of
 * terms of |k|·|dS| that cancel: the SIMT row plan's error on the same
 * inputs was 7.8e-3 (lavapipe), the subgroup-matrix forward's the same; atol is 4 of those
 * half-ulps. The subgroup-matrix backward rounds dS and W = P·keep to f16 for their products too
 * (as FlashAttention on tensor cores): up to 2⁻¹¹·Σ|dS|·|k| in dq and dk where Σ dS cancels to 0,
 * with Σ|dS| under 8 at D = 64 and |q|, |k| ≤ 2: about 1e-3 after the scale, inside these.
 */
export const MATRIX_TOL: Tolerance = { atol: 4e-3, rtol: 4e-3 };
export const MATRIX_TOL_LARGE: Tolerance = { atol: 1.6e-2, rtol: 4e-3 };
/** The fallbacks' (the SIMT plans' f32 and bf16 tolerances, fused_attention_tiled_test.ts). */
const SIMT_TOL: Partial<Record<FloatDType, Tolerance>> = {
  f32: { atol: 2e-5, rtol: 2e-4 },
  bf16: { atol: 1.6e-2, rtol: 1.6e-2 },
};

export interface MatrixAttentionCase {
  dims: AttentionDims;
  /** Bound of |q| and |k| (|v| and |dO| stay 2): 32 makes scores of ±1000 at D = 8. */
  range?: number;
  dropout?: boolean;
  packed?: boolean;
}

/**
 * o, dq, dk, dv of `c` with the plan in force (see {@link withPlan}) against f64, within the
 * subgroup-matrix plans' tolerances (the SIMT ones for f32 and bf16, which fall back); the kernels
 * dispatched.
 */
export async function checkMatrixAttention(
  c: MatrixAttentionCase,
  seed: number,
  dtype: FloatDType = "f16",
): Promise<string[]> {
  const { dims } = c, n = dims.b * dims.t * dims.h * dims.d, r = c.range ?? 2;
  const [q, k] = [1, 2].map((s) => quantize(uniform(n, seed + s, -r, r), dtype));
  const [v, g] = [3, 4].map((s) => quantize(uniform(n, seed + s, -2, 2), dtype));
  const range = new RandomGenerator(seed).take(dims.b * dims.h * dims.t * dims.t);
  const dropout = c.dropout ? { p: 0.25, range } : undefined;
  const factor = dropout && dropoutFactor(dropout.p, range, dims.t);
  const expected = causalAttentionWithGrads64(q, k, v, g, dims, factor);
  const { out, kernels } = await runAttention({ q, k, v, g }, dims, dtype, {
    packed: c.packed,
    dropout,
  });
  const tol = SIMT_TOL[dtype] ?? (r > 2 ? MATRIX_TOL_LARGE : MATRIX_TOL);
  for (const name of ["o", "dq", "dk", "dv"] as const) {
    assertClose(out[name], expected[name], tol, `${JSON.stringify(c)} ${dtype} ${name}`);
  }
  return kernels;
}
