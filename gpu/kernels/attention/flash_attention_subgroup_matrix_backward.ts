/**
 * The fused causal attention's backward on subgroup matrices (tensor cores
 * through Dawn), FlashAttention-2's two passes as the SIMT plans run them
 * (flash_attention.ts): f16 q, k, v, o and dO, the forward's log-sum-exp L
 * (f32), f32 sums and softmax math; every product of the backward on the
 * adapter's f16→f32 matrices. With p_ij = exp(s_ij·scale − L_i) and
 * dS = P ∘ (dP·keep − δ), δ_i = dO_i·O_i:
 *
 * - **dq** (a workgroup of `subgroups` subgroups owns BR = subgroups·M query
 *   rows, each subgroup a band of M): δ and L of its rows first (δ is written
 *   for dk/dv), Q and dO staged once; then over the keys up to its last row,
 *   `bc` at a time: K and V staged, S = Q·Kᵀ and dP = dO·Vᵀ into two f32
 *   tiles, dS (one pass over the band's M × bc cells, each invocation owning
 *   fixed ones) as f16 into a tile, and dq += dS·K in result matrices held
 *   across the key loop (nothing is rescaled in backward). dq = scale·Σ dS·K
 *   is stored through an f32 tile.
 * - **dk/dv** (BR key rows, a band of M per subgroup): K and V staged once;
 *   over the queries from its first row on: Q, dO, L and δ staged, Sᵀ = K·Qᵀ
 *   and dPᵀ = V·dOᵀ, W = P·keep and dS as f16 into two tiles, then dv += W·dO
 *   and dk += dS·Q in one block.
 *
 * NOTE: each step's products share one barrier and one block of
 * accumulations. Mesa 26.1.6's lavapipe, which runs these kernels in CI,
 * segfaulted running an earlier dk/dv that accumulated dv, wrote dS over W
 * behind another barrier and then accumulated dk (D ≥ 32 on 8×8×8); the same
 * work in this order runs there, with fewer barriers per step.
 *
 * dS and W are rounded to f16 for their products, as FlashAttention does on
 * tensor cores; p, dP and δ stay f32. Dropout's factor is entry (z, i, j) of
 * the same counters as every plan. Causal blocks past the diagonal are never
 * visited; the diagonal blocks and rows past T are masked per cell.
 *
 * Shapes come from the adapter's config (as the forward's, whose
 * `AttentionMatrix` it takes with its own `subgroups` and `bc`): D a
 * multiple of the config's K, N and 4, `bc` of N and K, the band's M·bc
 * cells and M·D outputs whole per invocation; the subgroup size pinned where
 * the device lets it.
 */
import type { Gpu } from "../../device/gpu.ts";
import type { DType } from "../../base/dtype.ts";
import { defineKernel } from "../../device/kernel.ts";
import { f16MatrixConfig } from "../../device/subgroup_matrix_configs.ts";
import { WGSL_RANDOM } from "../wgsl/random.ts";
import {
  ATTENTION_UNIFORMS,
  attentionBindings,
  type AttentionRows,
  keepFactor,
  KEYS,
  OUTPUT,
  OUTPUT_GRAD,
  QUERIES,
  VALUES,
} from "./flash_attention_shared.ts";
import {
  type AttentionMatrix,
  matrixAttentionProblem,
  matrixConstants,
  matrixMain,
  matrixTileLayout,
  matrixTypes,
  stageF16Rows,
} from "./flash_attention_subgroup_matrix.ts";

/** Kernel config of both passes: the matrix shape, head size D, dropout, packed q/k/v. */
export type MatrixAttentionBackwardConfig = Pick<AttentionMatrix, keyof AttentionMatrix> & {
  headSize: number;
  dropout: boolean;
  packed: boolean;
};

const range = (n: number) => [...Array(n).keys()];

/** The forward's tile layout, and each invocation's cells of its band's M × bc block. */
function layout(m: AttentionMatrix, headSize: number) {
  return { ...matrixTileLayout(m, headSize), cells: (m.sm * m.bc) / m.sg };
}

/**
 * Bytes of workgroup memory of the larger pass: four f16 tiles of D (BR rows
 * of the workgroup's side, bc of the other), two f16 tiles of the band's
 * cells (dS, and W in dk/dv), two f32 ones (S and dP) and two f32 statistics
 * per row.
 */
export function matrixBackwardBytes(m: AttentionMatrix, headSize: number): number {
  const { br, dp, bcp, w } = layout(m, headSize);
  return 2 * (2 * br * dp + 2 * m.bc * dp + 2 * br * bcp) +
    4 * (2 * br * w + 2 * Math.max(br, m.bc));
}

/** Loop iterations of one invocation over T (lavapipe caps them), generously. */
export function matrixBackwardIterations(m: AttentionMatrix, headSize: number, t: number): number {
  const { br, threads, cells, outputs } = layout(m, headSize);
  const staging = (rows: number) => Math.ceil(rows * headSize / 4 / threads);
  const perBlock = 2 * staging(m.bc) + Math.ceil(m.bc / threads) + 2 * headSize / m.sk + cells +
    8;
  return 2 * staging(br) + Math.ceil(br / threads) * (headSize / 4) + 2 * outputs +
    Math.ceil(t / m.bc) * perBlock;
}

/** Why `m` cannot run the backward at head size D in `dtype` on `gpu`, or null. */
export function matrixBackwardProblem(
  gpu: Gpu,
  m: AttentionMatrix,
  headSize: number,
  dtype: DType,
): string | null {
  // The forward's shape rules (config, pinning, D, bc) hold here too; then this pass's own.
  const shared = matrixAttentionProblem(gpu, m, headSize, dtype, { memory: false });
  if (shared) return shared;
  if ((m.sm * m.bc) % m.sg !== 0) return `the band's ${m.sm}×${m.bc} cells do not fit the subgroup`;
  const { limits } = gpu.adapterProfile;
  if (matrixBackwardBytes(m, headSize) > limits.maxComputeWorkgroupStorageSize) {
    return `its tiles need ${matrixBackwardBytes(m, headSize)} bytes of workgroup memory`;
  }
  if (layout(m, headSize).threads > limits.maxComputeInvocationsPerWorkgroup) {
    return "its workgroup has too many invocations";
  }
  return null;
}

/**
 * The subgroup-matrix backwards for head size D in `dtype` on `gpu`, the
 * largest first: 4 or 2 subgroups, with 4 or 2 matrices of the other side
 * per step, those that fit (on a 16×16×16 config with 48 KiB of workgroup
 * memory at D = 64: 2 subgroups of 16 rows over 32 keys first); none where
 * the device has no f16→f32 config, the dtype is not f16 or D does not fit.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, KNOWN_ADAPTERS } from "../../mod.ts";
 * import { matrixBackwardsFor } from "./flash_attention_subgroup_matrix_backward.ts";
 * const gpu = await initGpu({ backend: "dawn-null", adapter: KNOWN_ADAPTERS["nvidia-h100"] });
 * const [first] = matrixBackwardsFor(gpu, 64, "f16");
 * assert.deepEqual([first.subgroups, first.bc], [2, 32]);
 * assert.deepEqual(matrixBackwardsFor(gpu, 64, "f32"), []);
 * gpu.destroy();
 * ```
 */
export function matrixBackwardsFor(gpu: Gpu, headSize: number, dtype: DType): AttentionMatrix[] {
  const config = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);
  if (!config) return [];
  const { M: sm, N: sn, K: sk, subgroupSize: sg } = config,
    pin = config.subgroupSizing === "pinned";
  const step = Math.max(sn, sk);
  return [[4, 4], [2, 4], [4, 2], [2, 2]]
    .map(([subgroups, n]) => ({ sm, sn, sk, sg, pin, subgroups, bc: n * step }))
    .filter((m) => matrixBackwardProblem(gpu, m, headSize, dtype) === null);
}

/**
 * WGSL: the band's M × bc products of `left` rows (a tile of D, row_major)
 * and `right` rows (col_major: their transpose) over D, stored into the f32
 * tile `into` at the band's rows.
 */
function bandProducts(
  c: MatrixAttentionBackwardConfig,
  left: string,
  right: string,
  into: string,
): string {
  const t = matrixTypes(c), outs = range(c.bc / c.sn);
  return `{
    ${outs.map((n) => `var s${n} = ${t.result}();`).join(" ")}
    for (var kk = 0u; kk < D; kk += ${c.sk}u) {
      let l = subgroupMatrixLoad<${t.left}, row_major>(&${left}, band * DP + kk, DP);
      ${
    outs.map((n) =>
      `s${n} = subgroupMatrixMultiplyAccumulate(l, subgroupMatrixLoad<${t.right}, col_major>(&${right}, ${
        n * c.sn
      }u * DP + kk, DP), s${n});`
    ).join("\n      ")
  }
    }
    ${
    outs.map((n) => `subgroupMatrixStore<row_major>(&${into}, band * W + ${n * c.sn}u, s${n}, W);`)
      .join(" ")
  }
  }`;
}

/**
 * WGSL: for each `[acc, cells, rows]`, `acc{n}` += (the band's M × bc f16
 * tile `cells`) · (bc rows of the f16 tile `rows`, row_major), for each of the
 * D / N output matrices; one block for all, so their left matrices load once.
 */
function accumulate(c: MatrixAttentionBackwardConfig, terms: [string, string, string][]): string {
  const t = matrixTypes(c), steps = range(c.bc / c.sk), outs = range(c.headSize / c.sn);
  return `{
    ${
    terms.flatMap(([acc, cells]) =>
      steps.map((s) =>
        `let ${acc}_l${s} = subgroupMatrixLoad<${t.left}, row_major>(&${cells}, band * BCP + ${
          s * c.sk
        }u, BCP);`
      )
    ).join("\n    ")
  }
    ${
    terms.flatMap(([acc, _, rows]) =>
      outs.flatMap((n) =>
        steps.map((s) =>
          `${acc}${n} = subgroupMatrixMultiplyAccumulate(${acc}_l${s}, subgroupMatrixLoad<${t.right}, row_major>(&${rows}, ${
            s * c.sk
          }u * DP + ${n * c.sn}u, DP), ${acc}${n});`
        )
      )
    ).join("\n    ")
  }
  }`;
}

/** WGSL: the D / N result matrices `acc{n}` of the band, zeroed. */
function accumulators(c: MatrixAttentionBackwardConfig, acc: string): string {
  const { result } = matrixTypes(c);
  return range(c.headSize / c.sn).map((n) => `var ${acc}${n} = ${result}();`).join(" ");
}

/**
 * WGSL: `acc{n}` × `factor` written to rows r0 + band.. of binding `to` at
 * `rows`' indices (through the f32 tile; rows past T are not written).
 */
function writeRows(
  c: MatrixAttentionBackwardConfig,
  acc: string,
  to: string,
  rows: AttentionRows,
  factor: string,
): string {
  return `${
    range(c.headSize / c.sn).map((n) =>
      `subgroupMatrixStore<row_major>(&st, band * W + ${n * c.sn}u, ${acc}${n}, W);`
    ).join(" ")
  }
  workgroupBarrier();
  for (var x = 0u; x < OUTPUTS; x++) {
    let e = (lane + x * SG) * 4u;
    let row = band + e / D;
    let at = row * W + e % D;
    let i = r0 + row;
    if (i < p.t) {
      ${to}[${
    rows.index("i", "(e % D) / 4u")
  }] = vec4<f16>(vec4<f32>(st[at], st[at + 1u], st[at + 2u], st[at + 3u]) * ${factor});
    }
  }
  workgroupBarrier();`;
}

/** WGSL: the constants of both passes (see `matrixConstants`), and CELLS per invocation. */
function prelude(c: MatrixAttentionBackwardConfig): string {
  const { cells } = layout(c, c.headSize);
  return `${c.dropout ? WGSL_RANDOM : ""}
${matrixConstants(c, c.headSize, { CELLS: cells })}`;
}

/**
 * WGSL: for each of the invocation's cells of the band's M × bc block, its
 * row `row` (in the workgroup's block), column `col` (in the step) and
 * `body`'s statements.
 */
function eachCell(body: string): string {
  return `for (var x = 0u; x < CELLS; x++) {
      let e = lane + x * SG;
      let row = band + e / BC;
      let col = e % BC;
      ${body}
    }`;
}

/** Backward, per block of query rows: dq and δ = dO·O (see the module comment). */
export const matrixAttentionDqKernel = defineKernel({
  name: "flash_attention_subgroup_matrix_dq",
  bindings: (_: MatrixAttentionBackwardConfig) =>
    attentionBindings(["q", "k", "v", "o", "dout", "lse"], ["dq", "delta"], "vec4<f16>"),
  uniforms: ATTENTION_UNIFORMS,
  source: (c) => {
    const { br, dp, bcp, w } = layout(c, c.headSize);
    return `${prelude(c)}
var<workgroup> qt: array<f16, ${br * dp}>;
var<workgroup> gt: array<f16, ${br * dp}>; // dO
var<workgroup> kt: array<f16, ${c.bc * dp}>;
var<workgroup> vt: array<f16, ${c.bc * dp}>;
var<workgroup> dst: array<f16, ${br * bcp}>; // dS
var<workgroup> st: array<f32, ${br * w}>; // S, then dq
var<workgroup> pt: array<f32, ${br * w}>; // dP
var<workgroup> row_lse: array<f32, ${br}>;
var<workgroup> row_delta: array<f32, ${br}>;
${matrixMain(c)}
  ${stageF16Rows("BR", "r0", [["qt", QUERIES], ["gt", OUTPUT_GRAD]])}
  for (var r = lid; r < BR; r += NT) {
    let i = r0 + r;
    var d = 0.0;
    var l = 0.0;
    if (i < p.t) {
      for (var e = 0u; e < D4; e++) {
        d += dot(vec4<f32>(dout[${OUTPUT_GRAD.index("i", "e")}]), vec4<f32>(o[${
      OUTPUT.index("i", "e")
    }]));
      }
      delta[z * p.t + i] = d;
      l = lse[z * p.t + i];
    }
    row_delta[r] = d;
    row_lse[r] = l;
  }
  ${accumulators(c, "dq")}
  // Keys past the block's last row are masked for all its rows: stop there.
  let keys_end = min(r0 + BR, p.t);
  for (var k0 = 0u; k0 < keys_end; k0 += BC) {
    ${stageF16Rows("BC", "k0", [["kt", KEYS], ["vt", VALUES]])}
    workgroupBarrier();
    ${bandProducts(c, "qt", "kt", "st")}
    ${bandProducts(c, "gt", "vt", "pt")}
    workgroupBarrier();
    ${
      eachCell(`let i = r0 + row;
      let at = row * W + col;
      let keep = ${keepFactor(c.dropout, "i", "k0 + col")};
      let pij = select(0.0, exp(st[at] * p.scale - row_lse[row]), k0 + col <= i && i < p.t);
      dst[row * BCP + col] = f16(pij * (pt[at] * keep - row_delta[row]));`)
    }
    workgroupBarrier();
    ${accumulate(c, [["dq", "dst", "kt"]])}
    workgroupBarrier();
  }
  ${writeRows(c, "dq", "dq", QUERIES, "p.scale")}
}`;
  },
});

/** Backward, per block of key rows: dk and dv (after {@link matrixAttentionDqKernel} wrote δ). */
export const matrixAttentionDkvKernel = defineKernel({
  name: "flash_attention_subgroup_matrix_dkv",
  bindings: (c: MatrixAttentionBackwardConfig) =>
    attentionBindings(
      ["q", "k", "v", "dout", "lse", "delta"],
      // WebGPU forbids two writable bindings of one buffer: packed gradients go through one.
      c.packed ? ["dkv"] : ["dk", "dv"],
      "vec4<f16>",
    ),
  uniforms: ATTENTION_UNIFORMS,
  source: (c) => {
    const { br, dp, bcp, w } = layout(c, c.headSize);
    return `${prelude(c)}
var<workgroup> kt: array<f16, ${br * dp}>;
var<workgroup> vt: array<f16, ${br * dp}>;
var<workgroup> qt: array<f16, ${c.bc * dp}>;
var<workgroup> gt: array<f16, ${c.bc * dp}>; // dO
var<workgroup> wt: array<f16, ${br * bcp}>; // W = P·keep
var<workgroup> dst: array<f16, ${br * bcp}>; // dS
var<workgroup> st: array<f32, ${br * w}>; // Sᵀ, then dk and dv
var<workgroup> pt: array<f32, ${br * w}>; // dPᵀ
var<workgroup> col_lse: array<f32, ${c.bc}>;
var<workgroup> col_delta: array<f32, ${c.bc}>;
${matrixMain(c)}
  ${stageF16Rows("BR", "r0", [["kt", KEYS], ["vt", VALUES]])}
  ${accumulators(c, "dk")}
  ${accumulators(c, "dv")}
  // Queries before the block's first key see none of its keys: start there.
  for (var q0 = r0; q0 < p.t; q0 += BC) {
    ${stageF16Rows("BC", "q0", [["qt", QUERIES], ["gt", OUTPUT_GRAD]])}
    for (var r = lid; r < BC; r += NT) {
      let i = min(q0 + r, p.t - 1u);
      col_lse[r] = lse[z * p.t + i];
      col_delta[r] = delta[z * p.t + i];
    }
    workgroupBarrier();
    ${bandProducts(c, "kt", "qt", "st")}
    ${bandProducts(c, "vt", "gt", "pt")}
    workgroupBarrier();
    ${
      eachCell(`let j = r0 + row;
      let i = q0 + col;
      let at = row * W + col;
      let keep = ${keepFactor(c.dropout, "i", "j")};
      let pij = select(0.0, exp(st[at] * p.scale - col_lse[col]), j <= i && i < p.t);
      wt[row * BCP + col] = f16(pij * keep);
      dst[row * BCP + col] = f16(pij * (pt[at] * keep - col_delta[col]));`)
    }
    workgroupBarrier();
    ${accumulate(c, [["dv", "wt", "gt"], ["dk", "dst", "qt"]])}
    workgroupBarrier();
  }
  ${writeRows(c, "dk", c.packed ? "dkv" : "dk", KEYS, "p.scale")}
  ${writeRows(c, "dv", c.packed ? "dkv" : "dv", VALUES, "1.0")}
}`;
  },
});
