/**
 * The fused causal attention's forward on subgroup matrices (NVIDIA's tensor
 * cores through Dawn's `chromium_experimental_subgroup_matrix`): f16 q, k,
 * v, f32 sums and softmax. It writes what every plan's forward writes (o,
 * and the log-sum-exp of each query row of the scaled scores, f32 [B·H, T]),
 * so the backward is the row or register-tiled plans' (the plan's other
 * fields choose which; see `AttentionPlan.matrix` in plans.ts).
 *
 * A workgroup of `subgroups` subgroups owns BR = subgroups·M query rows, each
 * subgroup a band of M rows (its matrices' rows), and steps over the keys
 * `bc` at a time up to its last row (causal: later blocks are never read):
 *
 * 1. K and V rows of the block are staged as f16 (zeros past T).
 * 2. Scores: the band's Q (staged once) times Kᵀ, as bc/N result matrices
 *    over D/K steps; Kᵀ is read by `col_major` loads of the K tile (no
 *    transpose). They go to an f32 tile.
 * 3. Online softmax in scalar code, one invocation per row: the block's max
 *    of the scaled, causally masked scores, the rescale factor of the
 *    earlier blocks, the sum of p, and p·keep (dropout, the same mask bits
 *    as every plan) written as f16 over the K tile, which step 2 is done with.
 * 4. P·V: D/N result matrices, through the f32 tile into the output
 *    accumulators, held in scalar registers (vec4s, each invocation owning
 *    fixed columns of its band), which are rescaled there: a result matrix
 *    cannot be scaled row by row in place, and adding a fresh P·V to scalar
 *    accumulators takes one pass through the tile where rescaling matrices
 *    would take two (store, scale, load back).
 *
 * Every shape comes from the adapter's f16→f32 config (M, N, K, subgroup
 * size); D must be a multiple of K, N and 4, and the band's M·D outputs a
 * multiple of 4 per invocation, else the plan falls back to its SIMT
 * forward. Loops stay loops (lavapipe's compile time grows with unrolled
 * code); the generator unrolls only the bc/N score matrices and the bc/K
 * P matrices of one step.
 */
import type { Gpu } from "../../device/gpu.ts";
import type { DType } from "../../base/dtype.ts";
import { defineKernel } from "../../device/kernel.ts";
import { f16MatrixConfig, subgroupSizeAttribute } from "../../device/subgroup_matrix_configs.ts";
import { WGSL_RANDOM } from "../wgsl/random.ts";
import { WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "../wgsl/grid.ts";
import { WGSL_LOWEST } from "../wgsl/math.ts";
import {
  ATTENTION_UNIFORMS,
  attentionBindings,
  keepFactor,
  KEYS,
  OUTPUT,
  QUERIES,
  VALUES,
} from "./flash_attention_shared.ts";

/** A subgroup-matrix attention forward's shape (`AttentionPlan.matrix`, gpu/kernels/attention/plans.ts). */
export interface AttentionMatrix {
  /** The adapter's f16→f32 config's M: query rows per matrix. */
  sm: number;
  /** Its N: keys (in QKᵀ) or output columns (in P·V) per matrix. */
  sn: number;
  /** Its K: the reduction step. */
  sk: number;
  /** The adapter's largest subgroup size. */
  sg: number;
  /** The kernels pin their subgroups to `sg` (`@subgroup_size`; see subgroup_matrix_configs.ts). */
  pin: boolean;
  /** Subgroups per workgroup, each owning a band of M query rows. */
  subgroups: number;
  /** Keys per step (a multiple of N and K). */
  bc: number;
}

/**
 * Kernel config: the matrix shape, head size D, dropout. q, k, v and o are
 * f16. (`Pick` makes the interface's fields a plain record, as kernel
 * configs must be.)
 */
export type MatrixAttentionConfig = Pick<AttentionMatrix, keyof AttentionMatrix> & {
  headSize: number;
  dropout: boolean;
};

/** Halves of padding per f16 tile row (16 bytes: rows stay 16-byte aligned, banks staggered). */
const PAD16 = 8;
/** Floats of padding per f32 tile row (16 bytes). */
const PAD32 = 4;

const range = (n: number) => [...Array(n).keys()];

/**
 * Tile strides: f16 rows of D (Q, K, V), of bc (P), f32 rows of max(bc, D)
 * (scores, P·V); the workgroup's rows and invocations, and each invocation's
 * vec4 outputs. The backward's kernels share it.
 */
export function matrixTileLayout(m: AttentionMatrix, headSize: number) {
  const br = m.subgroups * m.sm;
  return {
    br,
    threads: m.subgroups * m.sg,
    dp: headSize + PAD16,
    bcp: m.bc + PAD16,
    w: Math.max(m.bc, headSize) + PAD32,
    // vec4 output accumulators per invocation: its band's M × D outputs over its subgroup.
    outputs: (m.sm * headSize) / (4 * m.sg),
  };
}

/** Bytes of workgroup memory: Q, K-then-P and V as f16, scores-then-P·V as f32, 3 f32 per row. */
export function matrixAttentionBytes(m: AttentionMatrix, headSize: number): number {
  const { br, dp, bcp, w } = matrixTileLayout(m, headSize);
  const f16 = br * dp + Math.max(m.bc * dp, br * bcp) + m.bc * dp;
  return 2 * f16 + 4 * (br * w + 3 * br);
}

/** Loop iterations of one invocation over T (lavapipe caps them), generously. */
export function matrixAttentionIterations(m: AttentionMatrix, headSize: number, t: number) {
  const { br, threads, outputs } = matrixTileLayout(m, headSize);
  const rowsPerLane = Math.ceil(m.sm / m.sg);
  const perBlock = Math.ceil(m.bc * headSize / 4 / threads) + headSize / m.sk +
    2 * m.bc * rowsPerLane + headSize / m.sn * (1 + m.bc / m.sk) + outputs + 4;
  return Math.ceil(br * headSize / 4 / threads) + Math.ceil(br / threads) + 2 * outputs +
    Math.ceil(t / m.bc) * perBlock;
}

/**
 * Why `m` cannot run attention of head size D in `dtype` on `gpu`, or null;
 * `memory: false` leaves out the forward's own workgroup memory and size
 * (the backward, which shares the other rules, checks its own).
 */
export function matrixAttentionProblem(
  gpu: Gpu,
  m: AttentionMatrix,
  headSize: number,
  dtype: DType,
  options: { memory?: boolean } = {},
): string | null {
  const profile = gpu.adapterProfile, config = f16MatrixConfig(profile.subgroupMatrixConfigs);
  if (dtype !== "f16") return `it multiplies f16 only, not ${dtype}`;
  if (!profile.subgroups || !config) return "the device has no f16→f32 subgroup matrices";
  if (config.M !== m.sm || config.N !== m.sn || config.K !== m.sk || config.subgroupSize !== m.sg) {
    return `its ${m.sm}×${m.sn}×${m.sk} shape is not the device's ${config.M}×${config.N}×${config.K}`;
  }
  if (m.pin !== (config.subgroupSizing === "pinned")) {
    return `it ${m.pin ? "pins" : "does not pin"} its subgroup size, unlike the device's config`;
  }
  if (headSize % m.sk !== 0 || headSize % m.sn !== 0 || headSize % 4 !== 0) {
    return `head size ${headSize} is not a multiple of the config's K, N and 4`;
  }
  if (m.bc % m.sn !== 0 || m.bc % m.sk !== 0 || (m.sm * headSize) % (4 * m.sg) !== 0) {
    return `keys per step ${m.bc} or M·D ${m.sm * headSize} do not fit the config`;
  }
  // The forward's own tiles and workgroup (the backward checks its own; options.memory false).
  if (options.memory === false) return null;
  const { limits } = profile;
  if (matrixAttentionBytes(m, headSize) > limits.maxComputeWorkgroupStorageSize) {
    return `its tiles need ${matrixAttentionBytes(m, headSize)} bytes of workgroup memory`;
  }
  if (matrixTileLayout(m, headSize).threads > limits.maxComputeInvocationsPerWorkgroup) {
    return "its workgroup has too many invocations";
  }
  return null;
}

/**
 * The subgroup-matrix forward for head size D in `dtype` on `gpu`: the
 * largest of 4 subgroups with 4 matrices of keys per step (64 × 64 on a
 * 16×16×16 config, 32 × 32 on lavapipe's 8×8×8) and 2 with 2 that fits;
 * undefined where none does (no config, not f16, D not a multiple of the
 * config's sizes, too little workgroup memory).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../../mod.ts";
 * import { attentionMatrixFor } from "./flash_attention_subgroup_matrix.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * // Only f16, and only where the device has subgroup matrices (Dawn).
 * assert.equal(attentionMatrixFor(gpu, 64, "f32"), undefined);
 * gpu.destroy();
 * ```
 */
export function attentionMatrixFor(
  gpu: Gpu,
  headSize: number,
  dtype: DType,
): AttentionMatrix | undefined {
  const config = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);
  if (!config) return undefined;
  const { M: sm, N: sn, K: sk, subgroupSize: sg } = config,
    pin = config.subgroupSizing === "pinned";
  return [4, 2].map((n) => ({ sm, sn, sk, sg, pin, subgroups: n, bc: n * Math.max(sn, sk) }))
    .find((m) => matrixAttentionProblem(gpu, m, headSize, dtype) === null);
}

/**
 * The subgroup-matrix forward a plan with `matrix` runs at head size D in
 * `dtype`: `matrix` where it fits, else the one that fits D (a plan tuned or
 * forced at another head size), else none: its SIMT forward runs (f32 and
 * bf16 always; f16 where D is not a multiple of the config's sizes).
 */
export function fittingMatrix(
  gpu: Gpu,
  matrix: AttentionMatrix | undefined,
  headSize: number,
  dtype: DType,
): AttentionMatrix | undefined {
  if (!matrix) return undefined;
  if (matrixAttentionProblem(gpu, matrix, headSize, dtype) === null) return matrix;
  return attentionMatrixFor(gpu, headSize, dtype);
}

/**
 * WGSL: the constants every subgroup-matrix attention kernel is written in
 * (the shape M, the subgroup size SG, NT invocations, BR rows, BC of the
 * other side per step, head size D and D4 vec4s, the tile strides DP, BCP
 * and W, and OUTPUTS vec4s per invocation), and `extra` ones.
 */
export function matrixConstants(
  m: AttentionMatrix,
  headSize: number,
  extra: Record<string, number> = {},
): string {
  const { br, threads, dp, bcp, w, outputs } = matrixTileLayout(m, headSize);
  const values = {
    M: m.sm,
    SG: m.sg,
    NT: threads,
    BR: br,
    BC: m.bc,
    D: headSize,
    D4: headSize / 4,
    DP: dp,
    BCP: bcp,
    W: w,
    OUTPUTS: outputs,
    ...extra,
  };
  return Object.entries(values).map(([name, v]) => `const ${name} = ${v}u;`).join("\n");
}

/**
 * WGSL: the entry point's first lines, as every subgroup-matrix attention
 * kernel starts (constants NT, M, BR and D4 declared): its workgroup (with the
 * pinned subgroup size where `m` pins it), which head z and block of BR rows
 * from r0 it owns, the head's offsets, and the invocation's band of M rows.
 */
export function matrixMain(m: AttentionMatrix): string {
  return `@compute @workgroup_size(NT)${subgroupSizeAttribute(m.sg, m.pin)}
fn main(${WGSL_GRID_BUILTINS},
    @builtin(subgroup_id) subgroup: u32, @builtin(subgroup_invocation_id) lane: u32) {
  let block = ${WGSL_WORKGROUP_INDEX} % p.blocks;
  let z = ${WGSL_WORKGROUP_INDEX} / p.blocks;
  if (z >= p.bh) { return; }
  let width = p.heads * D4;
  let head0 = (z / p.heads) * p.t * width + (z % p.heads) * D4;
  let in0 = (z / p.heads) * p.t * p.inWidth + (z % p.heads) * D4;
  let r0 = block * BR;
  // The subgroup's band of M rows (subgroup_id is uniform to the matrix builtins).
  let band = subgroup * M;`;
}

/**
 * The WGSL types of `m`'s matrices: an M×K left operand, a K×N right one
 * and the M×N f32 result (WGSL names columns first).
 */
export function matrixTypes(m: AttentionMatrix): { left: string; right: string; result: string } {
  return {
    left: `subgroup_matrix_left<f16, ${m.sk}, ${m.sm}>`,
    right: `subgroup_matrix_right<f16, ${m.sn}, ${m.sk}>`,
    result: `subgroup_matrix_result<f32, ${m.sn}, ${m.sm}>`,
  };
}

/**
 * WGSL: copies `count` rows from row `first` of each binding (vec4<f16>
 * rows of D4 vectors, read directly) into its f16 tile of row stride DP
 * (zeros past T). Invocation `lid` of NT copies every NT-th vector.
 */
export function stageF16Rows(
  count: string,
  first: string,
  copies: [string, typeof QUERIES][],
): string {
  const each = copies.map(([tile, from]) =>
    `{ let v = select(vec4<f16>(), ${from.name}[${from.index("min(g, p.t - 1u)", "e")}], g < p.t);
      for (var c = 0u; c < 4u; c++) { ${tile}[row * DP + e * 4u + c] = v[c]; } }`
  );
  return `for (var x = lid; x < ${count} * D4; x += NT) {
      let row = x / D4;
      let e = x % D4;
      let g = ${first} + row;
      ${each.join("\n      ")}
    }`;
}

/** The forward: o and the log-sum-exp of each query row (see the module comment). */
export const subgroupMatrixAttentionKernel = defineKernel({
  name: "flash_attention_subgroup_matrix_forward",
  bindings: (_: MatrixAttentionConfig) =>
    attentionBindings(["q", "k", "v"], ["o", "lse"], "vec4<f16>"),
  uniforms: ATTENTION_UNIFORMS,
  source: (c) => {
    const { sn, sk, bc } = c, { br, dp, bcp, w } = matrixTileLayout(c, c.headSize);
    const { left, right, result } = matrixTypes(c);
    const keys = range(bc / sn), steps = range(bc / sk);
    return `${c.dropout ? WGSL_RANDOM : ""}
${matrixConstants(c, c.headSize)}
var<workgroup> qt: array<f16, ${br * dp}>;
var<workgroup> kpt: array<f16, ${Math.max(bc * dp, br * bcp)}>; // K, then P
var<workgroup> vt: array<f16, ${bc * dp}>;
var<workgroup> st: array<f32, ${br * w}>; // scores, then P·V
var<workgroup> row_max: array<f32, ${br}>;
var<workgroup> row_sum: array<f32, ${br}>;
var<workgroup> row_rescale: array<f32, ${br}>;
${matrixMain(c)}
  ${stageF16Rows("BR", "r0", [["qt", QUERIES]])}
  for (var r = lid; r < BR; r += NT) { row_max[r] = ${WGSL_LOWEST}; row_sum[r] = 0.0; }
  var acc: array<vec4<f32>, OUTPUTS>;
  // Keys past the block's last row are masked for all its rows: stop there.
  let keys_end = min(r0 + BR, p.t);
  for (var k0 = 0u; k0 < keys_end; k0 += BC) {
    ${stageF16Rows("BC", "k0", [["kpt", KEYS], ["vt", VALUES]])}
    workgroupBarrier();
    ${keys.map((n) => `var s${n} = ${result}();`).join(" ")}
    for (var kk = 0u; kk < D; kk += ${sk}u) {
      let q = subgroupMatrixLoad<${left}, row_major>(&qt, band * DP + kk, DP);
      ${
      keys.map((n) =>
        `s${n} = subgroupMatrixMultiplyAccumulate(q, subgroupMatrixLoad<${right}, col_major>(&kpt, ${
          n * sn
        }u * DP + kk, DP), s${n});`
      ).join("\n      ")
    }
    }
    ${
      keys.map((n) => `subgroupMatrixStore<row_major>(&st, band * W + ${n * sn}u, s${n}, W);`)
        .join("\n    ")
    }
    workgroupBarrier();
    for (var r = lane; r < M; r += SG) {
      let row = band + r;
      let i = r0 + row;
      let keys_seen = min(i + 1u, p.t);
      let last_max = row_max[row];
      var block_max = last_max;
      for (var j = 0u; j < BC && k0 + j < keys_seen; j++) {
        block_max = max(block_max, st[row * W + j] * p.scale);
      }
      var sum = 0.0;
      for (var j = 0u; j < BC; j++) {
        let pj = select(0.0, exp(st[row * W + j] * p.scale - block_max), k0 + j < keys_seen);
        sum += pj;
        kpt[row * BCP + j] = f16(pj * ${keepFactor(c.dropout, "i", "k0 + j")});
      }
      let rescale = exp(last_max - block_max);
      row_max[row] = block_max;
      row_sum[row] = row_sum[row] * rescale + sum;
      row_rescale[row] = rescale;
    }
    workgroupBarrier();
    ${
      steps.map((s) =>
        `let p${s} = subgroupMatrixLoad<${left}, row_major>(&kpt, band * BCP + ${s * sk}u, BCP);`
      ).join("\n    ")
    }
    for (var n = 0u; n < D; n += ${sn}u) {
      var pv = ${result}();
      ${
      steps.map((s) =>
        `pv = subgroupMatrixMultiplyAccumulate(p${s}, subgroupMatrixLoad<${right}, row_major>(&vt, ${
          s * sk
        }u * DP + n, DP), pv);`
      ).join("\n      ")
    }
      subgroupMatrixStore<row_major>(&st, band * W + n, pv, W);
    }
    workgroupBarrier();
    for (var x = 0u; x < OUTPUTS; x++) {
      let e = (lane + x * SG) * 4u;
      let row = band + e / D;
      let at = row * W + e % D;
      let pv = vec4<f32>(st[at], st[at + 1u], st[at + 2u], st[at + 3u]);
      acc[x] = acc[x] * row_rescale[row] + pv;
    }
    workgroupBarrier();
  }
  for (var x = 0u; x < OUTPUTS; x++) {
    let e = (lane + x * SG) * 4u;
    let row = band + e / D;
    let i = r0 + row;
    if (i < p.t) { o[${OUTPUT.index("i", "(e % D) / 4u")}] = vec4<f16>(acc[x] / row_sum[row]); }
  }
  for (var r = lane; r < M; r += SG) {
    let i = r0 + band + r;
    if (i < p.t) { lse[z * p.t + i] = row_max[band + r] + log(row_sum[band + r]); }
  }
}`;
  },
});
