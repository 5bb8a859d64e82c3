/**
 * Fused causal attention in the manner of FlashAttention: the T×T scores and
 * probabilities are never written. q, k, v and the output are [B, T, H·D];
 * head h of batch b is the column window h·D .. h·D+D of every row, so heads
 * are split by strides inside the kernels and nothing is permuted.
 *
 * - Forward: one thread per query row i. It streams over keys 0..i in chunks,
 *   keeping an online softmax (running max m and sum l, f32) and an f32
 *   accumulator of D values, and writes the row's output and its
 *   log-sum-exp L = m + log l (f32, [B·H, T]) for backward.
 * - Backward, FlashAttention-2's way, in two passes with no atomics:
 *   `dq` (a thread per query row) recomputes p_ij = exp(s_ij − L_i), forms
 *   dq_i and writes δ_i = dO_i·O_i; `dkv` (a thread per key row j) walks the
 *   queries i ≥ j and forms dk_j and dv_j from the same p_ij and δ_i.
 *
 * Dropout on the attention weights is a pure function of the random range:
 * entry (z, i, j) of the virtual [B·H, T, T] matrix uses counter
 * `counter + (z·T + i)·T + j`, so backward and a checkpoint recompute replay
 * the same mask without storing it. With weights w = p·mask/(1 − p):
 * o_i = Σ_j w_ij v_j (l is the undropped sum), and since Σ_j p_ij·dp_ij =
 * dO_i·O_i still holds with the dropped weights, δ_i needs no change.
 *
 * All math is f32 whatever the storage dtype. Registers hold D values per row
 * (two or three rows of them), so D is part of the config and at most
 * {@link MAX_HEAD_SIZE}.
 */
import type { Gpu } from "../device.ts";
import type { DType } from "../dtype.ts";
import { type Binding, defineKernel } from "../kernel.ts";
import { type RandomRange, WGSL_RANDOM } from "../random.ts";
import { Tensor } from "../tensor.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./grid.ts";
import { failLoopIterations } from "./loop_limit.ts";
import { WGSL_LOWEST } from "./wgsl_math.ts";

/** The largest head size the kernels hold in registers. */
export const MAX_HEAD_SIZE = 256;

/** Keys scored at once before the running max is updated (one rescale per chunk). */
const KEY_CHUNK = 16;

/**
 * Kernel config: storage dtype, head size, lanes (4 when the head size allows
 * vec4 loads and math, else 1), rows per workgroup, and whether dropout is on.
 */
export type FlashAttentionConfig = {
  dtype: DType;
  headSize: number;
  lanes: 1 | 4;
  rows: number;
  dropout: boolean;
  /** q, k and v are one packed [B, T, 3C] tensor: the dk/dv pass writes both into one binding. */
  packed: boolean;
};

const UNIFORMS = {
  t: "u32",
  bh: "u32",
  heads: "u32",
  blocks: "u32",
  scale: "f32",
  p: "f32",
  keepScale: "f32",
  key: "u32",
  counter: "u32",
  inWidth: "u32",
  qOff: "u32",
  kOff: "u32",
  vOff: "u32",
} as const;

/**
 * Where this thread's row lives: z = b·H + h, the row index r (a query in
 * forward and dq, a key in dkv), and the offset of head h in row 0 of batch
 * b: `head0` in o and dout ([B, T, C], rows of `width`), `in0` in q, k and v
 * (rows of `p.inWidth`: C, or 3C when they are one packed tensor, each at its
 * offset `p.qOff`, `p.kOff`, `p.vOff`). All in elements of the bound arrays
 * (vectors of `lanes` values).
 */
function rowPrelude(c: FlashAttentionConfig): string {
  return `let block = ${WGSL_WORKGROUP_INDEX} % p.blocks;
  let z = ${WGSL_WORKGROUP_INDEX} / p.blocks;
  let r = block * ${c.rows}u + lid;
  if (z >= p.bh || r >= p.t) { return; }
  let width = p.heads * D;
  let head0 = (z / p.heads) * p.t * width + (z % p.heads) * D;
  let in0 = (z / p.heads) * p.t * p.inWidth + (z % p.heads) * D;`;
}

/** WGSL: the dropout factor of entry (z, i, j): 0, or 1/(1 − p) when kept; 1 without dropout. */
function keepFactor(c: FlashAttentionConfig, i: string, j: string): string {
  if (!c.dropout) return "1.0";
  return `select(0.0, p.keepScale, random_uniform(p.key, p.counter + (z * p.t + ${i}) * p.t + ${j}) >= p.p)`;
}

/**
 * The aliases the bodies are written in: S, the stored element (a value or a
 * vec4 of the dtype), F, its f32 form, and dotf, their dot product; D is the
 * head size in S elements.
 */
function header(c: FlashAttentionConfig): string {
  const vector = c.lanes === 4;
  return `${c.dropout ? WGSL_RANDOM : ""}
alias S = ${vector ? `vec4<${c.dtype}>` : c.dtype};
alias F = ${vector ? "vec4<f32>" : "f32"};
fn dotf(a: F, b: F) -> f32 { return ${vector ? "dot(a, b)" : "a * b"}; }
const D = ${c.headSize / c.lanes}u;
@compute @workgroup_size(${c.rows})
fn main(${WGSL_GRID_BUILTINS}) {
  ${rowPrelude(c)}`;
}

/** Row statistics (log-sum-exp, δ) are f32; everything else has the storage dtype. */
const STATISTICS = ["lse", "delta"];

function bindingsOf<B extends string>(
  reads: B[],
  writes: B[],
  c: FlashAttentionConfig,
): Binding<B>[] {
  const stored = c.lanes === 4 ? `vec4<${c.dtype as "f32" | "f16"}>` as const : c.dtype;
  const typeOf = (name: B) => STATISTICS.includes(name) ? "f32" : stored;
  return [
    ...reads.map((name) => ({ name, type: typeOf(name) })),
    ...writes.map((name) => ({ name, type: typeOf(name), write: true })),
  ];
}

/** Forward: o and the log-sum-exp of each query row. */
export const flashAttentionForwardKernel = defineKernel({
  name: "flash_attention_forward",
  bindings: (c: FlashAttentionConfig) => bindingsOf(["q", "k", "v"], ["o", "lse"], c),
  uniforms: UNIFORMS,
  source: (c) =>
    `${header(c)}
  let i = r;
  let qi = in0 + i * p.inWidth + p.qOff;
  let oi = head0 + i * width;
  var qs: array<F, D>;
  var acc: array<F, D>;
  for (var e = 0u; e < D; e++) { qs[e] = F(q[qi + e]) * p.scale; acc[e] = F(0.0); }
  var m = ${WGSL_LOWEST};
  var l = 0.0;
  var s: array<f32, ${KEY_CHUNK}>;
  for (var j0 = 0u; j0 <= i; j0 += ${KEY_CHUNK}u) {
    let count = min(${KEY_CHUNK}u, i + 1u - j0);
    var chunkMax = m;
    for (var jj = 0u; jj < count; jj++) {
      let kj = in0 + (j0 + jj) * p.inWidth + p.kOff;
      var dot = 0.0;
      for (var e = 0u; e < D; e++) { dot += dotf(qs[e], F(k[kj + e])); }
      s[jj] = dot;
      chunkMax = max(chunkMax, dot);
    }
    let rescale = exp(m - chunkMax);
    m = chunkMax;
    l *= rescale;
    for (var e = 0u; e < D; e++) { acc[e] *= rescale; }
    for (var jj = 0u; jj < count; jj++) {
      let j = j0 + jj;
      let pj = exp(s[jj] - m);
      l += pj;
      let w = pj * ${keepFactor(c, "i", "j")};
      let vj = in0 + j * p.inWidth + p.vOff;
      for (var e = 0u; e < D; e++) { acc[e] += w * F(v[vj + e]); }
    }
  }
  let inv = 1.0 / l;
  for (var e = 0u; e < D; e++) { o[oi + e] = S(acc[e] * inv); }
  lse[z * p.t + i] = m + log(l);
}`,
});

/** Backward, per query row: dq and δ = dO·O. */
export const flashAttentionDqKernel = defineKernel({
  name: "flash_attention_dq",
  bindings: (c: FlashAttentionConfig) =>
    bindingsOf(["q", "k", "v", "o", "dout", "lse"], ["dq", "delta"], c),
  uniforms: UNIFORMS,
  source: (c) =>
    `${header(c)}
  let i = r;
  let qi = in0 + i * p.inWidth + p.qOff;
  let oi = head0 + i * width;
  var qs: array<F, D>;
  var gi: array<F, D>;
  var acc: array<F, D>;
  var d = 0.0;
  for (var e = 0u; e < D; e++) {
    qs[e] = F(q[qi + e]) * p.scale;
    gi[e] = F(dout[oi + e]);
    d += dotf(gi[e], F(o[oi + e]));
    acc[e] = F(0.0);
  }
  let li = lse[z * p.t + i];
  for (var j = 0u; j <= i; j++) {
    let kj = in0 + j * p.inWidth + p.kOff;
    let vj = in0 + j * p.inWidth + p.vOff;
    var s = 0.0;
    var dp = 0.0;
    var krow: array<F, D>;
    for (var e = 0u; e < D; e++) {
      krow[e] = F(k[kj + e]);
      s += dotf(qs[e], krow[e]);
      dp += dotf(gi[e], F(v[vj + e]));
    }
    let ds = exp(s - li) * (dp * ${keepFactor(c, "i", "j")} - d);
    for (var e = 0u; e < D; e++) { acc[e] += ds * krow[e]; }
  }
  for (var e = 0u; e < D; e++) { dq[qi + e] = S(acc[e] * p.scale); }
  delta[z * p.t + i] = d;
}`,
});

/** Backward, per key row: dk and dv (after {@link flashAttentionDqKernel} wrote δ). */
export const flashAttentionDkvKernel = defineKernel({
  name: "flash_attention_dkv",
  bindings: (c: FlashAttentionConfig) =>
    bindingsOf(
      ["q", "k", "v", "dout", "lse", "delta"],
      // WebGPU forbids two writable bindings of one buffer: packed gradients go through one.
      c.packed ? ["dkv"] : ["dk", "dv"],
      c,
    ),
  uniforms: UNIFORMS,
  source: (c) =>
    `${header(c)}
  let j = r;
  let kj = in0 + j * p.inWidth + p.kOff;
  let vj = in0 + j * p.inWidth + p.vOff;
  var ks: array<F, D>;
  var vs: array<F, D>;
  var dks: array<F, D>;
  var dvs: array<F, D>;
  for (var e = 0u; e < D; e++) {
    ks[e] = F(k[kj + e]) * p.scale;
    vs[e] = F(v[vj + e]);
    dks[e] = F(0.0);
    dvs[e] = F(0.0);
  }
  for (var i = j; i < p.t; i++) {
    let qi = in0 + i * p.inWidth + p.qOff;
    let oi = head0 + i * width;
    var s = 0.0;
    var dp = 0.0;
    var qrow: array<F, D>;
    var grow: array<F, D>;
    for (var e = 0u; e < D; e++) {
      qrow[e] = F(q[qi + e]);
      grow[e] = F(dout[oi + e]);
      s += dotf(qrow[e], ks[e]);
      dp += dotf(grow[e], vs[e]);
    }
    let pij = exp(s - lse[z * p.t + i]);
    let keep = ${keepFactor(c, "i", "j")};
    let ds = pij * (dp * keep - delta[z * p.t + i]);
    let w = pij * keep;
    for (var e = 0u; e < D; e++) {
      dvs[e] += w * grow[e];
      dks[e] += ds * qrow[e];
    }
  }
  for (var e = 0u; e < D; e++) {
    ${c.packed ? "dkv" : "dk"}[kj + e] = S(dks[e] * p.scale);
    ${c.packed ? "dkv" : "dv"}[vj + e] = S(dvs[e]);
  }
}`,
});

/** Sizes of one fused attention call. */
export interface FlashAttentionShape {
  /** Batch B. */
  batch: number;
  /** Sequence length T. */
  t: number;
  /** Heads H. */
  heads: number;
  /** Head size D. */
  headSize: number;
  /** Rows per workgroup (default: the adapter's tuned count; the tuner sets it to time candidates). */
  rows?: number;
}

/** Dropout of the attention weights: probability and the random range of B·H·T·T numbers. */
export interface AttentionDropout {
  /** Drop probability in [0, 1). */
  p: number;
  /** Where the mask's numbers come from. */
  range: RandomRange;
}

/** The rows-per-workgroup candidates (one thread per row); the tuner picks one per adapter and dtype. */
export const ATTENTION_ROW_CANDIDATES = [16, 32, 64, 128] as const;

/** Rows per workgroup before tuning (and where it was skipped). */
export const DEFAULT_ATTENTION_ROWS = 64;

/**
 * Rows per workgroup for T rows: the adapter's tuned count, or less for short
 * sequences (the smallest candidate that covers T), so few threads idle.
 */
function rowsPerWorkgroup(gpu: Gpu, dtype: DType, t: number): number {
  const tuned = gpu.attentionRows.get(dtype) ?? DEFAULT_ATTENTION_ROWS;
  const covering = ATTENTION_ROW_CANDIDATES.find((r) => r >= t) ?? tuned;
  return Math.min(tuned, covering);
}

/**
 * Where q, k and v are: three [B, T, C] tensors, or one packed [B, T, 3C]
 * tensor holding them side by side (a fused C→3C projection's output).
 */
export type AttentionInputs = { q: Tensor; k: Tensor; v: Tensor } | { qkv: Tensor };

/** The three input bindings (one buffer thrice when packed: read-only aliasing is allowed). */
function inputTensors(inputs: AttentionInputs): { q: Tensor; k: Tensor; v: Tensor } {
  return "qkv" in inputs ? { q: inputs.qkv, k: inputs.qkv, v: inputs.qkv } : inputs;
}

function setup(
  inputs: AttentionInputs,
  s: FlashAttentionShape,
  dropout: AttentionDropout | null,
) {
  const { q } = inputTensors(inputs), dtype = q.dtype;
  const rows = s.rows ?? rowsPerWorkgroup(q.gpu, dtype, s.t);
  const blocks = Math.ceil(s.t / rows), bh = s.batch * s.heads;
  const lanes = s.headSize % 4 === 0 ? 4 : 1;
  // Per row: up to T keys (or queries), each with two loops over the head's
  // D / lanes vectors where the compiler does not unroll them.
  const iterations = s.t * ((2 * s.headSize) / lanes + 4);
  if (iterations > q.gpu.loopIterationLimit) {
    failLoopIterations(
      q.gpu,
      iterations,
      "fusedCausalAttention",
      `attention over T = ${s.t} with head size ${s.headSize}`,
      "Use shorter sequences, a smaller head size (more heads), or a GPU adapter.",
    );
  }
  const packed = "qkv" in inputs;
  const config = {
    dtype,
    headSize: s.headSize,
    lanes,
    rows,
    dropout: dropout !== null,
    packed,
  } as const;
  const c = (s.heads * s.headSize) / lanes; // C in bound elements
  const uniforms = {
    t: s.t,
    heads: s.heads,
    blocks,
    bh,
    scale: 1 / Math.sqrt(s.headSize),
    p: dropout?.p ?? 0,
    keepScale: dropout ? 1 / (1 - dropout.p) : 1,
    key: dropout?.range.key ?? 0,
    counter: dropout?.range.counter ?? 0,
    inWidth: packed ? 3 * c : c,
    qOff: 0,
    kOff: packed ? c : 0,
    vOff: packed ? 2 * c : 0,
  };
  return { config, uniforms, grid: grid1d(blocks * bh), empty: bh === 0 || s.t === 0 };
}

/** o [B, T, H·D] and lse [B·H, T] (f32) of causal attention (no autograd). */
export function launchFlashAttention(
  inputs: AttentionInputs,
  s: FlashAttentionShape,
  dropout: AttentionDropout | null,
): { o: Tensor; lse: Tensor } {
  const { q, k, v } = inputTensors(inputs), gpu = q.gpu;
  const o = Tensor.empty([s.batch, s.t, s.heads * s.headSize], q.dtype, gpu);
  const lse = Tensor.empty([s.batch * s.heads, s.t], "f32", gpu);
  const { config, uniforms, grid, empty } = setup(inputs, s, dropout);
  if (empty) return { o, lse };
  gpu.dispatch(
    gpu.kernel(flashAttentionForwardKernel, config),
    { q, k, v, o, lse },
    uniforms,
    grid,
  );
  return { o, lse };
}

/**
 * The gradients of the inputs, in their layout ([dq, dk, dv], or [dqkv] when
 * packed), from the saved inputs, output and log-sum-exp and the output's
 * gradient (no autograd).
 */
export function launchFlashAttentionBackward(
  saved: { inputs: AttentionInputs; o: Tensor; lse: Tensor },
  dout: Tensor,
  s: FlashAttentionShape,
  dropout: AttentionDropout | null,
): Tensor[] {
  const { o, lse } = saved, { q, k, v } = inputTensors(saved.inputs), gpu = q.gpu;
  const packed = "qkv" in saved.inputs;
  const grads = (packed ? [q] : [q, k, v]).map((x) => Tensor.empty(x.shape, x.dtype, gpu));
  const { config, uniforms, grid, empty } = setup(saved.inputs, s, dropout);
  if (empty) return grads;
  const [dq, dk, dv] = packed ? [grads[0], grads[0], grads[0]] : grads;
  const delta = Tensor.empty(lse.shape, "f32", gpu);
  gpu.dispatch(
    gpu.kernel(flashAttentionDqKernel, config),
    { q, k, v, o, dout, lse, dq, delta },
    uniforms,
    grid,
  );
  gpu.dispatch(
    gpu.kernel(flashAttentionDkvKernel, config),
    { q, k, v, dout, lse, delta, ...(packed ? { dkv: dk } : { dk, dv }) },
    uniforms,
    grid,
  );
  delta.dispose();
  return grads;
}
