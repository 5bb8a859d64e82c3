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
 * All math is f32 whatever the storage dtype: elements are read and written
 * through the dtype accessors (`ld_`/`st_`, `ld4_`/`st4_` on vec4 bindings),
 * so one source serves f32, f16 and bf16. Registers hold D values per row
 * (two or three rows of them), so D is part of the config and at most
 * {@link MAX_HEAD_SIZE}.
 *
 * These are the row plans; plans with a `tile` run the register-tiled kernels
 * of flash_attention_tiled.ts instead (GPUs only; same inputs, outputs,
 * log-sum-exp, δ and dropout mask), chosen here by the same plan lookup; and
 * plans with a `matrix` run the f16 forward of
 * flash_attention_subgroup_matrix.ts (tensor cores through Dawn) before
 * their row or tiled backward.
 */
import type { Gpu } from "../../device/gpu.ts";

import type { DType } from "../../base/dtype.ts";
import { defineKernel, type ElementType } from "../../device/kernel.ts";
import { type RandomRange, WGSL_RANDOM } from "../wgsl/random.ts";
import { DeviceArray } from "../../device/device_array.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "../wgsl/grid.ts";
import { failLoopIterations } from "../loop_limit.ts";
import { attentionPlanFor } from "./settings.ts";
import {
  ATTENTION_ROW_CANDIDATES,
  type AttentionPlan,
  DEFAULT_ATTENTION_PLAN,
  type FlashAttentionShape,
  TILED_ATTENTION_PLANS,
  tileFits,
} from "./plans.ts";
import { WGSL_LOWEST } from "../wgsl/math.ts";
import {
  ATTENTION_UNIFORMS,
  attentionBindings,
  type AttentionRows,
  keepFactor,
  KEYS,
  OUTPUT_GRAD,
  QUERIES,
  VALUES,
} from "./flash_attention_shared.ts";
import {
  type AttentionMatrix,
  fittingMatrix,
  matrixAttentionIterations,
  subgroupMatrixAttentionKernel,
} from "./flash_attention_subgroup_matrix.ts";
import {
  matrixAttentionDkvKernel,
  matrixAttentionDqKernel,
  matrixBackwardIterations,
  matrixBackwardProblem,
  matrixBackwardsFor,
} from "./flash_attention_subgroup_matrix_backward.ts";
import {
  tiledAttentionDkvKernel,
  tiledAttentionDqKernel,
  tiledAttentionForwardKernel,
  tiledAttentionIterations,
} from "./flash_attention_tiled.ts";

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
  /**
   * AttentionRows of the other side (keys in forward and dq, queries in dkv) the
   * workgroup stages in workgroup memory per step, shared by all its threads
   * (a multiple of the key chunk); 0: each thread reads them from storage.
   */
  stage: number;
};

/**
 * Where this thread's row lives: z = b·H + h, the row index r (a query in
 * forward and dq, a key in dkv), and the offset of head h in row 0 of batch
 * b: `head0` in o and dout ([B, T, C], rows of `width`), `in0` in q, k and v
 * (rows of `p.inWidth`: C, or 3C when they are one packed tensor, each at its
 * offset `p.qOff`, `p.kOff`, `p.vOff`). All in elements of the bound arrays
 * (vectors of `lanes` values).
 */
function rowPrelude(c: FlashAttentionConfig): string {
  // Staged kernels keep every thread to the end (they meet at barriers): a
  // thread past the last row works on the last row and stores nothing.
  const rowCheck = c.stage > 0
    ? `if (z >= p.bh) { return; }
  let real_row = block * ${c.rows}u + lid < p.t;
  let r = min(block * ${c.rows}u + lid, p.t - 1u);`
    : `let r = block * ${c.rows}u + lid;
  if (z >= p.bh || r >= p.t) { return; }`;
  return `let block = ${WGSL_WORKGROUP_INDEX} % p.blocks;
  let z = ${WGSL_WORKGROUP_INDEX} / p.blocks;
  ${rowCheck}
  let width = p.heads * D;
  let head0 = (z / p.heads) * p.t * width + (z % p.heads) * D;
  let in0 = (z / p.heads) * p.t * p.inWidth + (z % p.heads) * D;`;
}

/** WGSL: element (a value or a vec4, as f32) `index` of binding `name`, through its accessor. */
function load(c: FlashAttentionConfig, name: string, index: string): string {
  return `${c.lanes === 4 ? "ld4" : "ld"}_${name}(${index})`;
}

/** WGSL: stores `value` (f32 or vec4<f32>) at element `index` of binding `name`. */
function store(c: FlashAttentionConfig, name: string, index: string, value: string): string {
  return `${c.lanes === 4 ? "st4" : "st"}_${name}(${index}, ${value});`;
}

/**
 * The aliases the bodies are written in: F, an element in f32 (a value or a
 * vec4), T, a staged tile element (the f16 element for f16, keeping its tiles
 * at half the bytes; F otherwise: bf16 is widened while staged), and dotf,
 * their dot product; D is the head size in F elements.
 */
function header(c: FlashAttentionConfig, staged: Record<string, "T" | "f32"> = {}): string {
  const vector = c.lanes === 4;
  // Staged rows: `stage` rows of D elements each, or one f32 per row.
  const tiles = c.stage > 0
    ? Object.entries(staged).map(([name, type]) =>
      `var<workgroup> ${name}: array<${type}, ${
        type === "T" ? c.stage * c.headSize / c.lanes : c.stage
      }>;`
    )
    : [];
  return `${c.dropout ? WGSL_RANDOM : ""}
alias F = ${vector ? "vec4<f32>" : "f32"};
alias T = ${c.dtype !== "f16" ? "F" : vector ? "vec4<f16>" : "f16"};
fn dotf(a: F, b: F) -> f32 { return ${vector ? "dot(a, b)" : "a * b"}; }
const D = ${c.headSize / c.lanes}u;
${tiles.join("\n")}
@compute @workgroup_size(${c.rows})
fn main(${WGSL_GRID_BUILTINS}) {
  ${rowPrelude(c)}`;
}

/** The bindings of a row kernel: vectors of `lanes` values of the dtype. */
function rowBindings<B extends string>(reads: B[], writes: B[], c: FlashAttentionConfig) {
  return attentionBindings(
    reads,
    writes,
    (c.lanes === 4 ? `vec4<${c.dtype}>` : c.dtype) as ElementType,
  );
}

/**
 * Staged kernels: statements that copy rows t0 .. t0 + stage − 1 (those below
 * `limit`) of each operand into its workgroup tile, then wait for all
 * threads. `rows` gives, per tile, the binding whose rows of D elements it
 * holds; `values` per tile the single f32 of a row.
 */
function stageRows(
  c: FlashAttentionConfig,
  limit: string,
  rows: Record<string, AttentionRows>,
  values: Record<string, (row: string) => string> = {},
): string {
  const copies = Object.entries(rows).map(([tile, from]) =>
    `${tile}[e] = T(${load(c, from.name, from.index("row", "e % D"))});`
  );
  const singles = Object.entries(values).map(([tile, at]) =>
    `for (var e = lid; e < ${c.stage}u; e += ${c.rows}u) {
      let row = t0 + e;
      if (row < ${limit}) { ${tile}[e] = ${at("row")}; }
    }`
  );
  return `for (var e = lid; e < ${c.stage}u * D; e += ${c.rows}u) {
      let row = t0 + e / D;
      if (row < ${limit}) { ${copies.join(" ")} }
    }
    ${singles.join("\n    ")}
    workgroupBarrier();`;
}

/** A statement kept only for real rows in the staged kernels (their extra threads store nothing). */
function ifActive(c: FlashAttentionConfig, statements: string): string {
  return c.stage > 0 ? `if (real_row) { ${statements} }` : statements;
}

/**
 * The loop over keys 0..i of a query row i (forward and dq): `body(end)`
 * handles keys from `first` to `end` − 1 reading key j's element e as
 * `kAt(j)` and `vAt(j)`. Staged, keys come in tiles shared by the workgroup.
 */
function overKeys(
  c: FlashAttentionConfig,
  body: (
    first: string,
    end: string,
    kAt: (j: string) => string,
    vAt: (j: string) => string,
  ) => string,
): string {
  if (c.stage === 0) {
    return body(
      "0u",
      "i + 1u",
      (j) => load(c, "k", KEYS.index(j, "e")),
      (j) => load(c, "v", VALUES.index(j, "e")),
    );
  }
  // The workgroup's last row needs keys up to it: stage those, tile by tile.
  return `let last = min((block + 1u) * ${c.rows}u, p.t);
  for (var t0 = 0u; t0 < last; t0 += ${c.stage}u) {
    ${stageRows(c, "last", { ktile: KEYS, vtile: VALUES })}
    ${
    body(
      "t0",
      `min(t0 + ${c.stage}u, i + 1u)`,
      (j) => `ktile[(${j} - t0) * D + e]`,
      (j) => `vtile[(${j} - t0) * D + e]`,
    )
  }
    workgroupBarrier();
  }`;
}

/** Forward: o and the log-sum-exp of each query row. */
export const flashAttentionForwardKernel = defineKernel({
  name: "flash_attention_forward",
  bindings: (c: FlashAttentionConfig) => rowBindings(["q", "k", "v"], ["o", "lse"], c),
  uniforms: ATTENTION_UNIFORMS,
  source: (c) =>
    `${header(c, { ktile: "T", vtile: "T" })}
  let i = r;
  let qi = in0 + i * p.inWidth + p.qOff;
  let oi = head0 + i * width;
  var qs: array<F, D>;
  var acc: array<F, D>;
  for (var e = 0u; e < D; e++) { qs[e] = ${load(c, "q", "qi + e")} * p.scale; acc[e] = F(0.0); }
  var m = ${WGSL_LOWEST};
  var l = 0.0;
  var s: array<f32, ${KEY_CHUNK}>;
  ${
      overKeys(c, (first, end, kAt, vAt) =>
        `let keysEnd = ${end};
  for (var j0 = ${first}; j0 < keysEnd; j0 += ${KEY_CHUNK}u) {
    let count = min(${KEY_CHUNK}u, keysEnd - j0);
    var chunkMax = m;
    for (var jj = 0u; jj < count; jj++) {
      var dot = 0.0;
      for (var e = 0u; e < D; e++) { dot += dotf(qs[e], F(${kAt("(j0 + jj)")})); }
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
      let w = pj * ${keepFactor(c.dropout, "i", "j")};
      for (var e = 0u; e < D; e++) { acc[e] += w * F(${vAt("j")}); }
    }
  }`)
    }
  let inv = 1.0 / l;
  ${
      ifActive(
        c,
        `for (var e = 0u; e < D; e++) { ${store(c, "o", "oi + e", "acc[e] * inv")} }
  lse[z * p.t + i] = m + log(l);`,
      )
    }
}`,
});

/** Backward, per query row: dq and δ = dO·O. */
export const flashAttentionDqKernel = defineKernel({
  name: "flash_attention_dq",
  bindings: (c: FlashAttentionConfig) =>
    rowBindings(["q", "k", "v", "o", "dout", "lse"], ["dq", "delta"], c),
  uniforms: ATTENTION_UNIFORMS,
  source: (c) =>
    `${header(c, { ktile: "T", vtile: "T" })}
  let i = r;
  let qi = in0 + i * p.inWidth + p.qOff;
  let oi = head0 + i * width;
  var qs: array<F, D>;
  var gi: array<F, D>;
  var acc: array<F, D>;
  var d = 0.0;
  for (var e = 0u; e < D; e++) {
    qs[e] = ${load(c, "q", "qi + e")} * p.scale;
    gi[e] = ${load(c, "dout", "oi + e")};
    d += dotf(gi[e], ${load(c, "o", "oi + e")});
    acc[e] = F(0.0);
  }
  let li = lse[z * p.t + i];
  ${
      overKeys(c, (first, end, kAt, vAt) =>
        `for (var j = ${first}; j < ${end}; j++) {
    var s = 0.0;
    var dp = 0.0;
    var krow: array<F, D>;
    for (var e = 0u; e < D; e++) {
      krow[e] = F(${kAt("j")});
      s += dotf(qs[e], krow[e]);
      dp += dotf(gi[e], F(${vAt("j")}));
    }
    let ds = exp(s - li) * (dp * ${keepFactor(c.dropout, "i", "j")} - d);
    for (var e = 0u; e < D; e++) { acc[e] += ds * krow[e]; }
  }`)
    }
  ${
      ifActive(
        c,
        `for (var e = 0u; e < D; e++) { ${store(c, "dq", "qi + e", "acc[e] * p.scale")} }
  delta[z * p.t + i] = d;`,
      )
    }
}`,
});

/**
 * The loop over queries j..T−1 of a key row j (dkv): `body` handles queries
 * `start` to `end` − 1 reading query i's q and dO elements e and its lse and
 * δ through the accessors. Staged, queries come in tiles shared by the
 * workgroup.
 */
function overQueries(
  c: FlashAttentionConfig,
  body: (
    start: string,
    end: string,
    at: { q: (i: string) => string; g: (i: string) => string; lse: string; delta: string },
  ) => string,
): string {
  if (c.stage === 0) {
    return body("j", "p.t", {
      q: (i) => load(c, "q", QUERIES.index(i, "e")),
      g: (i) => load(c, "dout", OUTPUT_GRAD.index(i, "e")),
      lse: "lse[z * p.t + i]",
      delta: "delta[z * p.t + i]",
    });
  }
  // The workgroup's first key row needs every query from it on.
  return `for (var t0 = block * ${c.rows}u; t0 < p.t; t0 += ${c.stage}u) {
    ${
    stageRows(c, "p.t", { qtile: QUERIES, gtile: OUTPUT_GRAD }, {
      ltile: (row) => `lse[z * p.t + ${row}]`,
      dtile: (row) => `delta[z * p.t + ${row}]`,
    })
  }
    ${
    body("max(t0, j)", `min(t0 + ${c.stage}u, p.t)`, {
      q: (i) => `qtile[(${i} - t0) * D + e]`,
      g: (i) => `gtile[(${i} - t0) * D + e]`,
      lse: "ltile[i - t0]",
      delta: "dtile[i - t0]",
    })
  }
    workgroupBarrier();
  }`;
}

/** Backward, per key row: dk and dv (after {@link flashAttentionDqKernel} wrote δ). */
export const flashAttentionDkvKernel = defineKernel({
  name: "flash_attention_dkv",
  bindings: (c: FlashAttentionConfig) =>
    rowBindings(
      ["q", "k", "v", "dout", "lse", "delta"],
      // WebGPU forbids two writable bindings of one buffer: packed gradients go through one.
      c.packed ? ["dkv"] : ["dk", "dv"],
      c,
    ),
  uniforms: ATTENTION_UNIFORMS,
  source: (c) =>
    `${header(c, { qtile: "T", gtile: "T", ltile: "f32", dtile: "f32" })}
  let j = r;
  let kj = in0 + j * p.inWidth + p.kOff;
  let vj = in0 + j * p.inWidth + p.vOff;
  var ks: array<F, D>;
  var vs: array<F, D>;
  var dks: array<F, D>;
  var dvs: array<F, D>;
  for (var e = 0u; e < D; e++) {
    ks[e] = ${load(c, "k", "kj + e")} * p.scale;
    vs[e] = ${load(c, "v", "vj + e")};
    dks[e] = F(0.0);
    dvs[e] = F(0.0);
  }
  ${
      overQueries(c, (start, end, at) =>
        `for (var i = ${start}; i < ${end}; i++) {
    var s = 0.0;
    var dp = 0.0;
    var qrow: array<F, D>;
    var grow: array<F, D>;
    for (var e = 0u; e < D; e++) {
      qrow[e] = F(${at.q("i")});
      grow[e] = F(${at.g("i")});
      s += dotf(qrow[e], ks[e]);
      dp += dotf(grow[e], vs[e]);
    }
    let pij = exp(s - ${at.lse});
    let keep = ${keepFactor(c.dropout, "i", "j")};
    let ds = pij * (dp * keep - ${at.delta});
    let w = pij * keep;
    for (var e = 0u; e < D; e++) {
      dvs[e] += w * grow[e];
      dks[e] += ds * qrow[e];
    }
  }`)
    }
  ${
      ifActive(
        c,
        `for (var e = 0u; e < D; e++) {
    ${store(c, c.packed ? "dkv" : "dk", "kj + e", "dks[e] * p.scale")}
    ${store(c, c.packed ? "dkv" : "dv", "vj + e", "dvs[e]")}
  }`,
      )
    }
}`,
});

export {
  ATTENTION_PLAN_CANDIDATES,
  ATTENTION_ROW_CANDIDATES,
  type AttentionPlan,
  attentionPlanCandidates,
  DEFAULT_ATTENTION_PLAN,
  type FlashAttentionShape,
  TILED_ATTENTION_PLANS,
} from "./plans.ts";

/** Dropout of the attention weights: probability and the random range of B·H·T·T numbers. */
export interface AttentionDropout {
  /** Drop probability in [0, 1). */
  p: number;
  /** Where the mask's numbers come from. */
  range: RandomRange;
}

/**
 * Workgroup memory of a staged plan: the dkv pass's two tiles of D and two f32
 * per staged row (f16 tiles hold f16; bf16 ones are widened to f32).
 */
function stagedBytes(stage: number, headSize: number, dtype: DType): number {
  return stage * (2 * headSize * (dtype === "f16" ? 2 : 4) + 8);
}

/**
 * The plan for T rows of head size D: the tuned one (this shape's pick on
 * GPUs, else the dtype's; see gpu/kernels/attention/settings.ts), with fewer
 * rows for short sequences (the smallest candidate that covers T, so few
 * threads idle) and a smaller stage where D's tiles would not fit the
 * device's workgroup memory; a subgroup-matrix forward where it fits D and
 * the dtype (see {@link fittingMatrix}).
 */
function planFor(gpu: Gpu, dtype: DType, s: FlashAttentionShape): AttentionPlan {
  const { matrix, matrixBackward, ...tuned } = attentionPlanFor(gpu, dtype, s) ??
    DEFAULT_ATTENTION_PLAN;
  const simt = simtPlanFor(gpu, dtype, s, tuned);
  return withMatrices(gpu, simt, { matrix, matrixBackward }, s.headSize, dtype);
}

/**
 * `plan` with the subgroup-matrix forward and backward of `wanted` that fit
 * head size D in `dtype` (or the ones that do, for a plan tuned or forced at
 * another head size); without those that none fits.
 */
function withMatrices(
  gpu: Gpu,
  plan: AttentionPlan,
  wanted: Pick<AttentionPlan, "matrix" | "matrixBackward">,
  headSize: number,
  dtype: DType,
): AttentionPlan {
  const { matrix: _, matrixBackward: __, ...simt } = plan;
  const matrix = fittingMatrix(gpu, wanted.matrix, headSize, dtype);
  if (!matrix) return simt;
  const matrixBackward = fittingBackward(gpu, wanted.matrixBackward, headSize, dtype);
  return matrixBackward ? { ...simt, matrix, matrixBackward } : { ...simt, matrix };
}

/** `m` where it fits D, else the largest backward that does, else none (as {@link fittingMatrix}). */
function fittingBackward(
  gpu: Gpu,
  m: AttentionMatrix | undefined,
  headSize: number,
  dtype: DType,
): AttentionMatrix | undefined {
  if (!m) return undefined;
  if (matrixBackwardProblem(gpu, m, headSize, dtype) === null) return m;
  return matrixBackwardsFor(gpu, headSize, dtype)[0];
}

/** {@link planFor} of a plan without a subgroup-matrix forward. */
function simtPlanFor(
  gpu: Gpu,
  dtype: DType,
  s: FlashAttentionShape,
  tuned: AttentionPlan,
): AttentionPlan {
  const { t, headSize } = s;
  if (tuned.tile) {
    // Tuned at one head size: at another, the first tiled plan that fits (else the default).
    if (tileFits(gpu, tuned, headSize)) return tuned;
    return TILED_ATTENTION_PLANS.find((p) => tileFits(gpu, p, headSize)) ?? DEFAULT_ATTENTION_PLAN;
  }
  const covering = ATTENTION_ROW_CANDIDATES.find((r) => r >= t) ?? tuned.rows;
  return {
    rows: Math.min(tuned.rows, covering),
    stage: fittingStage(gpu, tuned.stage, headSize, dtype),
  };
}

/** `stage`, halved while its tiles pass the workgroup memory limit (0 below 16 rows). */
function fittingStage(gpu: Gpu, stage: number, headSize: number, dtype: DType): number {
  const limit = gpu.adapterProfile.limits.maxComputeWorkgroupStorageSize;
  let fitting = stage;
  while (fitting >= 16 && stagedBytes(fitting, headSize, dtype) > limit) fitting /= 2;
  return fitting >= 16 ? fitting : 0;
}

/**
 * Where q, k and v are: three [B, T, C] tensors, or one packed [B, T, 3C]
 * tensor holding them side by side (a fused C→3C projection's output).
 */
export type AttentionInputs = { q: DeviceArray; k: DeviceArray; v: DeviceArray } | {
  qkv: DeviceArray;
};

/** The three input bindings (one buffer thrice when packed: read-only aliasing is allowed). */
function inputTensors(inputs: AttentionInputs): { q: DeviceArray; k: DeviceArray; v: DeviceArray } {
  return "qkv" in inputs ? { q: inputs.qkv, k: inputs.qkv, v: inputs.qkv } : inputs;
}

function setup(
  inputs: AttentionInputs,
  s: FlashAttentionShape,
  dropout: AttentionDropout | null,
) {
  const { q } = inputTensors(inputs), dtype = q.dtype;
  const plan = s.plan
    ? withMatrices(
      q.gpu,
      { ...s.plan, stage: fittingStage(q.gpu, s.plan.stage, s.headSize, dtype) },
      s.plan,
      s.headSize,
      dtype,
    )
    : planFor(q.gpu, dtype, s);
  const { rows, stage, tile, matrix, matrixBackward } = plan;
  const bh = s.batch * s.heads;
  // The tiled kernels read scalars (their staging loads are coalesced anyway).
  const lanes = s.headSize % 4 === 0 && !tile ? 4 : 1;
  // Per row: up to T keys (or queries), each with two loops over the head's
  // D / lanes vectors where the compiler does not unroll them; staged, each
  // thread also copies its share of every tile.
  const vectors = s.headSize / lanes;
  const staging = stage > 0 ? Math.ceil(s.t / stage) * (Math.ceil(stage * vectors / rows) + 2) : 0;
  const iterations = Math.max(
    tile ? tiledAttentionIterations(tile, s.headSize, s.t) : s.t * (2 * vectors + 4) + staging,
    matrix ? matrixAttentionIterations(matrix, s.headSize, s.t) : 0,
    matrixBackward ? matrixBackwardIterations(matrixBackward, s.headSize, s.t) : 0,
  );
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
  const common = { dtype, headSize: s.headSize, dropout: dropout !== null, packed };
  const config = { ...common, lanes, rows, stage } as const;
  // C in bound elements (of `width` values) and the blocks of `rows` rows.
  const uniformsOf = (width: number, rows: number) => {
    const c = (s.heads * s.headSize) / width;
    return {
      t: s.t,
      heads: s.heads,
      blocks: Math.ceil(s.t / rows),
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
  };
  const uniforms = uniformsOf(lanes, rows), gpu = q.gpu;
  const grid = grid1d(uniforms.blocks * bh);
  // The three kernels of the plan, compiled on first use.
  const kernels = tile
    ? {
      forward: () => gpu.kernel(tiledAttentionForwardKernel, { ...common, ...tile }),
      dq: () => gpu.kernel(tiledAttentionDqKernel, { ...common, ...tile }),
      dkv: () => gpu.kernel(tiledAttentionDkvKernel, { ...common, ...tile }),
    }
    : {
      forward: () => gpu.kernel(flashAttentionForwardKernel, config),
      dq: () => gpu.kernel(flashAttentionDqKernel, config),
      dkv: () => gpu.kernel(flashAttentionDkvKernel, config),
    };
  // A subgroup-matrix forward has its own blocks (and binds vec4s); the backward is the plan's.
  const matrixUniforms = matrix && uniformsOf(4, matrix.subgroups * matrix.sm);
  const forward = matrix && matrixUniforms
    ? {
      kernel: () =>
        gpu.kernel(subgroupMatrixAttentionKernel, {
          ...matrix,
          headSize: s.headSize,
          dropout: dropout !== null,
        }),
      uniforms: matrixUniforms,
      grid: grid1d(matrixUniforms.blocks * bh),
    }
    : { kernel: kernels.forward, uniforms, grid };
  // A subgroup-matrix backward likewise (both of its passes share blocks of BR rows).
  const backwardUniforms = matrixBackward &&
    uniformsOf(4, matrixBackward.subgroups * matrixBackward.sm);
  const backward = matrixBackward && backwardUniforms
    ? {
      dq: () => gpu.kernel(matrixAttentionDqKernel, { ...matrixBackward, ...common }),
      dkv: () => gpu.kernel(matrixAttentionDkvKernel, { ...matrixBackward, ...common }),
      uniforms: backwardUniforms,
      grid: grid1d(backwardUniforms.blocks * bh),
    }
    : { dq: kernels.dq, dkv: kernels.dkv, uniforms, grid };
  // A captured step draws a new dropout range at each replay (the range object is refilled).
  const live = dropout ? () => ({ key: dropout.range.key, counter: dropout.range.counter }) : null;
  return { kernels, forward, backward, uniforms, grid, live, empty: bh === 0 || s.t === 0 };
}

/** o [B, T, H·D] and lse [B·H, T] (f32) of causal attention (no autograd). */
export function launchFlashAttention(
  inputs: AttentionInputs,
  s: FlashAttentionShape,
  dropout: AttentionDropout | null,
): { o: DeviceArray; lse: DeviceArray } {
  const { q, k, v } = inputTensors(inputs), gpu = q.gpu;
  const o = DeviceArray.empty([s.batch, s.t, s.heads * s.headSize], q.dtype, gpu);
  const lse = DeviceArray.empty([s.batch * s.heads, s.t], "f32", gpu);
  const { forward, live, empty } = setup(inputs, s, dropout);
  if (empty) return { o, lse };
  gpu.dispatch(forward.kernel(), { q, k, v, o, lse }, forward.uniforms, forward.grid, {}, live);
  return { o, lse };
}

/**
 * The gradients of the inputs, in their layout ([dq, dk, dv], or [dqkv] when
 * packed), from the saved inputs, output and log-sum-exp and the output's
 * gradient (no autograd).
 */
export function launchFlashAttentionBackward(
  saved: { inputs: AttentionInputs; o: DeviceArray; lse: DeviceArray },
  dout: DeviceArray,
  s: FlashAttentionShape,
  dropout: AttentionDropout | null,
): DeviceArray[] {
  const { o, lse } = saved, { q, k, v } = inputTensors(saved.inputs), gpu = q.gpu;
  const packed = "qkv" in saved.inputs;
  const grads = (packed ? [q] : [q, k, v]).map((x) => DeviceArray.empty(x.shape, x.dtype, gpu));
  const { backward, live, empty } = setup(saved.inputs, s, dropout);
  if (empty) return grads;
  const [dq, dk, dv] = packed ? [grads[0], grads[0], grads[0]] : grads;
  const delta = DeviceArray.empty(lse.shape, "f32", gpu);
  gpu.dispatch(
    backward.dq(),
    { q, k, v, o, dout, lse, dq, delta },
    backward.uniforms,
    backward.grid,
    {},
    live,
  );
  gpu.dispatch(
    backward.dkv(),
    { q, k, v, dout, lse, delta, ...(packed ? { dkv: dk } : { dk, dv }) },
    backward.uniforms,
    backward.grid,
    {},
    live,
  );
  delta.dispose();
  return grads;
}
