/**
 * The `subgroup-matrix` GEMM tiling: f16 products on the adapter's subgroup
 * matrices (NVIDIA's tensor cores through Dawn's
 * `chromium_experimental_subgroup_matrix`), f32 accumulation.
 *
 * - A workgroup of `wgx × wgy` subgroups owns a `tm·wgy × tn·wgx` result
 *   tile; each subgroup a `tm × tn` block of it, as (tm/M)·(tn/N) result
 *   matrices of the adapter's config (M, N, K and the subgroup size are
 *   fields of the tiling, made from the adapter's configs: a shape it does
 *   not list fails pipeline creation). A subgroup finds its block by
 *   `@builtin(subgroup_id)` (the matrix builtins need subgroup-uniform
 *   offsets, which `local_invocation_id / size` is not to WGSL), and the
 *   workgroup is sized for subgroups of the adapter's largest size.
 * - Operands are staged through workgroup memory as f16 tiles, `tk` of k at
 *   a time, the next k-tile loaded into registers while the current one is
 *   multiplied (as the vec4 tiling does; written as loops, since lavapipe's
 *   compile time grows with unrolled code): vec4 global loads
 *   on interior, aligned k-tiles, checked scalar loads with zero fill
 *   elsewhere, so edge tiles need no second kernel and the matrix loop never
 *   checks bounds.
 * - Each tile keeps its operand's own layout (its contiguous index fastest,
 *   rows padded by 8 halves against bank conflicts): the global loads and the
 *   stores into workgroup memory are contiguous in every orientation, and a
 *   transposed operand (Aᵀ of a weight gradient, Wᵀ of x·Wᵀ) is read by
 *   `col_major` matrix loads instead of being transposed.
 * - The epilogue stores each result matrix into the subgroup's own f32
 *   scratch in workgroup memory, whose invocations then write it out through
 *   bias and activation (vec4 stores on interior tiles, checked scalar
 *   stores at the edges), as the other tilings do.
 */
import type { MatmulTiling } from "./settings.ts";
import {
  type SubgroupMatrixConfig,
  subgroupSizeAttribute,
} from "../../device/subgroup_matrix_configs.ts";
import { epilogue, type GemmIo, range } from "./gemm_io.ts";
import { activationVec4 } from "./gemm_vec4.ts";
import { type Activation, WGSL_MATH } from "../wgsl/math.ts";

/** A subgroup-matrix tiling: the matmul tiling fields plus the config it was made for. */
export interface SubgroupMatrixTiling extends MatmulTiling {
  variant: "subgroup-matrix";
  /** The config's M (result matrix rows). */
  sm: number;
  /** The config's N (result matrix columns). */
  sn: number;
  /** The config's K. */
  sk: number;
  /** The adapter's largest subgroup: invocations per subgroup. */
  sg: number;
  /** The kernel pins its subgroups to `sg` invocations (`@subgroup_size`; see subgroup_matrix_configs.ts). */
  pin: boolean;
}

/** Halves of padding per row of a workgroup tile (16 bytes: rows stay 16-byte aligned). */
const PAD = 8;

/** The config fields of `t` (a tiling of another kind has none). */
function matrixOf(t: MatmulTiling) {
  return {
    sm: t.sm as number,
    sn: t.sn as number,
    sk: t.sk as number,
    sg: t.sg as number,
    pin: t.pin === true,
  };
}

/** Why a subgroup-matrix kernel cannot be built with `t`, or null. */
export function subgroupMatrixShapeProblem(t: MatmulTiling): string | null {
  const { sm, sn, sk, sg } = matrixOf(t);
  const sizes = { sm, sn, sk, sg };
  if (t.pin !== undefined && typeof t.pin !== "boolean") {
    return `the subgroup-matrix variant needs pin true or false, not ${t.pin}`;
  }
  const bad = Object.entries(sizes).find(([, v]) => !(Number.isInteger(v) && v >= 1));
  if (bad) return `the subgroup-matrix variant needs ${bad[0]} (an integer >= 1), not ${bad[1]}`;
  if (t.tm % sm !== 0 || t.tn % sn !== 0 || t.tk % sk !== 0) {
    return `the subgroup-matrix variant needs tm, tn and tk multiples of the config's ` +
      `${sm}, ${sn} and ${sk}, not ${t.tm}, ${t.tn} and ${t.tk}`;
  }
  if (t.tk % 4 !== 0 || sn % 4 !== 0 || (sm * sn) % (4 * sg) !== 0) {
    return `the subgroup-matrix variant needs tk and N multiples of 4 and M·N a multiple of ` +
      `4 × the subgroup size ${sg}, not ${t.tk}, ${sn} and ${sm * sn}`;
  }
  return null;
}

/** Rows × row stride (halves) of an operand's tile of `extent` × tk, along its contiguous index. */
function tileShape(extent: number, tk: number, alongK: boolean): [number, number] {
  return alongK ? [extent, tk + PAD] : [tk, extent + PAD];
}

/** Bytes of workgroup memory: both f16 tiles (at the larger orientation) and the f32 scratch. */
export function subgroupMatrixTileBytes(t: MatmulTiling): number {
  const { sm, sn } = matrixOf(t);
  const tile = (extent: number) =>
    Math.max(
      ...[true, false].map((along) => tileShape(extent, t.tk, along)).map(([r, s]) => r * s),
    );
  return 2 * (tile(t.tm * t.wgy) + tile(t.tn * t.wgx)) + 4 * t.wgx * t.wgy * sm * sn;
}

/**
 * Loop iterations of one invocation over a reduction of `k` (lavapipe caps
 * them): per k-tile, and one more, the staging loops (loads and stores of
 * both operands) and the steps of K; then each result matrix's stores.
 */
export function subgroupMatrixLoops(t: MatmulTiling, k: number): number {
  const { sm, sn, sk, sg } = matrixOf(t);
  const threads = t.wgx * t.wgy * sg;
  const staging = 2 * (Math.ceil(t.tm * t.wgy * t.tk / 4 / threads) +
    Math.ceil(t.tn * t.wgx * t.tk / 4 / threads));
  const pairs = (t.tm / sm) * (t.tn / sn);
  return (Math.ceil(k / t.tk) + 1) * (1 + staging + t.tk / sk) +
    pairs * Math.ceil(sm * sn / sg);
}

/** Invocations per workgroup: `wgx × wgy` subgroups of the adapter's size. */
export function subgroupMatrixThreads(t: MatmulTiling): number {
  return t.wgx * t.wgy * matrixOf(t).sg;
}

/** `"subgroup-matrix 128x128x32 s64x64 m16x16x16"`: the block, per-subgroup block, matrix shape. */
export function subgroupMatrixName(t: MatmulTiling): string {
  const { sm, sn, sk } = matrixOf(t);
  return `subgroup-matrix ${t.tm * t.wgy}x${t.tn * t.wgx}x${t.tk} s${t.tm}x${t.tn} ` +
    `m${sm}x${sn}x${sk}`;
}

/**
 * The workgroup shapes offered, in matrices of a 16×16 config: rows and
 * columns of result matrices per subgroup, subgroups along rows and columns.
 * Unmeasured on a GPU (no adapter with subgroup matrices was at hand): the
 * SIMT probe's best workgroup tiles (128×128 and 128×256, k-step 32,
 * `shared/perf/h100-fast-matmul-2026-11-23.jsonl`), as 4 or 8 subgroups of
 * 64×64 or 64×32, and a 64×64 tile for small products. The tuners time them
 * against the SIMT tilings per class and shape, so a slow one is never used.
 */
const SHAPES = [
  { rows: 4, cols: 4, wgy: 2, wgx: 2 }, // 128×128, 4 subgroups of 64×64
  { rows: 4, cols: 2, wgy: 2, wgx: 4 }, // 128×128, 8 subgroups of 64×32
  { rows: 4, cols: 4, wgy: 2, wgx: 4 }, // 128×256, 8 subgroups of 64×64
  { rows: 2, cols: 2, wgy: 2, wgx: 2 }, // 64×64, 4 subgroups of 32×32
] as const;

/**
 * The subgroup-matrix tilings offered for `config` (see {@link SHAPES}):
 * the same counts of result matrices per subgroup whatever the config (so
 * registers per invocation stay alike: 8×8 matrices over 8 invocations hold
 * as many values each as 16×16 ones over 32), columns scaled where N < M,
 * and a k-step of 32 (or two of the config's K where that is more).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { subgroupMatrixTilings } from "./gemm_subgroup_matrix.ts";
 * const f16 = { componentType: "f16", resultComponentType: "f32" };
 * const [nvidia] = subgroupMatrixTilings({ ...f16, M: 16, N: 16, K: 16, subgroupSize: 32 });
 * assert.deepEqual([nvidia.tm * nvidia.wgy, nvidia.tn * nvidia.wgx, nvidia.tk], [128, 128, 32]);
 * // lavapipe's 8×8×8: as many matrices per subgroup, so half the tile.
 * const [lavapipe] = subgroupMatrixTilings({ ...f16, M: 8, N: 8, K: 8, subgroupSize: 8 });
 * assert.deepEqual([lavapipe.tm * lavapipe.wgy, lavapipe.sg], [64, 8]);
 * ```
 */
export function subgroupMatrixTilings(config: SubgroupMatrixConfig): SubgroupMatrixTiling[] {
  const { M, N, K, subgroupSize } = config;
  const tk = Math.max(2, Math.ceil(32 / K)) * K;
  return SHAPES.map((s) => ({
    variant: "subgroup-matrix",
    tm: s.rows * M,
    tn: Math.max(1, Math.round(s.cols * M / N)) * N,
    wgx: s.wgx,
    wgy: s.wgy,
    tk,
    sm: M,
    sn: N,
    sk: K,
    sg: subgroupSize,
    pin: config.subgroupSizing === "pinned",
  }));
}

/** How one operand's tile is staged (see {@link stagingLoops}). */
interface Operand {
  /** "a" (rows of the result) or "b" (its columns). */
  op: "a" | "b";
  /** Rows (a) or columns (b) of the workgroup tile. */
  extent: number;
  /** The operand's contiguous index is k. */
  alongK: boolean;
  /** Halves per row of its workgroup tile. */
  stride: number;
  /** WGSL: the tile's first row (a) or column (b), and its bound. */
  origin: string;
  limit: string;
  /** The element at (outer, k) as an f32 expression; vec4 along the contiguous index. */
  at: (outer: string, k: string) => string;
  vec?: (outer: string, k: string) => string;
}

/**
 * Loops that stage one operand's k-tile at `k0` in units of four elements
 * along its contiguous index, `regs` units per invocation in a private
 * array (unrolled by GPU compilers, a loop for lavapipe, whose compile time
 * grows with unrolled code): `load` fills the registers (vec4 loads while
 * `kt < vector_tiles`, else checked scalars with zero fill) and `store`
 * writes them into the tile in the operand's own layout.
 */
function stagingLoops(o: Operand, tk: number, threads: number, kCount: string) {
  const fast = o.alongK ? tk / 4 : o.extent / 4, units = o.extent * tk / 4;
  const regs = Math.ceil(units / threads);
  const unit = `let u = t + r * ${threads}u;${
    regs * threads > units ? ` if (u >= ${units}u) { continue; }` : ""
  }
      let slow = u / ${fast}u; let fast = u % ${fast}u;`;
  // (outer, k) of the unit's first element; the other three follow along the contiguous index.
  const [outer, k] = o.alongK
    ? [`(${o.origin} + slow)`, `(k0 + fast * 4u)`]
    : [`(${o.origin} + fast * 4u)`, `(k0 + slow)`];
  const checked = range(4).map((c) => {
    const [oc, kc] = o.alongK ? [outer, `(${k} + ${c}u)`] : [`(${outer} + ${c}u)`, k];
    return `if (${oc} < ${o.limit} && ${kc} < ${kCount}) { v[${c}] = ${o.at(oc, kc)}; }`;
  });
  const scalar = `var v = vec4<f32>();\n      ${checked.join("\n      ")}\n      r${o.op}[r] = v;`;
  const loads = o.vec
    ? `if (kt < vector_tiles) { r${o.op}[r] = ${
      o.vec(outer, k)
    }; } else {\n      ${scalar}\n      }`
    : scalar;
  const each = (body: string) =>
    `for (var r = 0u; r < ${regs}u; r++) {\n      ${unit}\n      ${body}\n    }`;
  return {
    registers: `var r${o.op}: array<vec4<f32>, ${regs}>;`,
    load: each(loads),
    store: each(
      range(4).map((c) =>
        `tile_${o.op}[slow * ${o.stride}u + fast * 4u + ${c}u] = f16(r${o.op}[r][${c}]);`
      ).join(" "),
    ),
  };
}

/** The WGSL body of a GEMM kernel with the subgroup-matrix tiling `t` (see the module comment). */
export function subgroupMatrixWgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string {
  const problem = subgroupMatrixShapeProblem(t);
  if (problem) throw new Error(`subgroupMatrixWgsl: ${problem}`);
  const { sm, sn, sk, sg, pin } = matrixOf(t);
  const { tk, wgx } = t;
  const bm = t.tm * t.wgy, bn = t.tn * t.wgx, subgroups = t.wgx * t.wgy;
  const threads = subgroups * sg;
  const kCount = io.kCount ?? "p.k";
  const aAlongK = (io.aAlong ?? "k") === "k", bAlongK = io.bAlong === "k";
  const [aRows, aStride] = tileShape(bm, tk, aAlongK);
  const [bRows, bStride] = tileShape(bn, tk, bAlongK);
  const vector = io.vector;
  const a = stagingLoops(
    {
      op: "a",
      extent: bm,
      alongK: aAlongK,
      stride: aStride,
      origin: "tile_row",
      limit: "p.m",
      at: io.aAt,
      vec: vector?.aVec,
    },
    tk,
    threads,
    kCount,
  );
  const b = stagingLoops(
    {
      op: "b",
      extent: bn,
      alongK: bAlongK,
      stride: bStride,
      origin: "tile_col",
      limit: "p.n",
      at: (col, k) => io.bAt(k, col),
      vec: vector && ((col, k) => vector.bVec(k, col)),
    },
    tk,
    threads,
    kCount,
  );
  const rowsM = t.tm / sm, colsN = t.tn / sn;
  const left = `subgroup_matrix_left<f16, ${sk}, ${sm}>`;
  const right = `subgroup_matrix_right<f16, ${sn}, ${sk}>`;
  // A tile along k holds [outer][k]: element (outer, k) at outer·stride + k, else at
  // k·stride + outer. A's rows are the left matrix's rows (row_major when along k), B's columns
  // the right matrix's columns (col_major when along k).
  const matrix = (type: string, tile: string, alongK: boolean, stride: number, first: string) => {
    const major = alongK === (tile === "tile_a") ? "row_major" : "col_major";
    const offset = alongK ? `(${first}) * ${stride}u + kk` : `kk * ${stride}u + ${first}`;
    return `subgroupMatrixLoad<${type}, ${major}>(&${tile}, ${offset}, ${stride}u)`;
  };
  const leftAt = (i: number) => matrix(left, "tile_a", aAlongK, aStride, `row0 + ${i * sm}u`);
  const rightAt = (j: number) => matrix(right, "tile_b", bAlongK, bStride, `col0 + ${j * sn}u`);
  const acc = (i: number, j: number) => `acc${i}_${j}`;
  const pairs = range(rowsM).flatMap((i) => range(colsN).map((j) => [i, j] as const));
  // One step of K: the subgroup's left and right matrices, then every product.
  const math = [
    ...range(rowsM).map((i) => `let l${i} = ${leftAt(i)};`),
    ...range(colsN).map((j) => `let r${j} = ${rightAt(j)};`),
    ...pairs.map(([i, j]) =>
      `${acc(i, j)} = subgroupMatrixMultiplyAccumulate(l${i}, r${j}, ${acc(i, j)});`
    ),
  ];
  const join = (lines: string[], indent: string) => lines.join(`\n${indent}`);
  return `${WGSL_MATH}${io.prelude ?? ""}
var<workgroup> tile_a: array<f16, ${aRows * aStride}>;
var<workgroup> tile_b: array<f16, ${bRows * bStride}>;
var<workgroup> scratch: array<f32, ${subgroups * sm * sn}>; // a result matrix per subgroup
@compute @workgroup_size(${threads})${subgroupSizeAttribute(sg, pin)}
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(subgroup_id) subgroup: u32, @builtin(subgroup_invocation_id) lane: u32) {
  let tile_row = wid.y * ${bm}u;
  let tile_col = wid.x * ${bn}u;
  let t = lid.x;
  let z = wid.z;
  ${io.setup}
  // The subgroup's block (subgroup_id is uniform to the matrix builtins; lid.x / ${sg} is not).
  let row0 = (subgroup / ${wgx}u) * ${t.tm}u;
  let col0 = (subgroup % ${wgx}u) * ${t.tn}u;
  // Interior: the whole tile in range and the operands vec4-aligned (uniform per workgroup).
  let whole = tile_row + ${bm}u <= p.m && tile_col + ${bn}u <= p.n;
  let k_tiles = (${kCount} + ${tk - 1}u) / ${tk}u;
  let vector_tiles = select(0u, ${kCount} / ${tk}u, whole && ${vector ? vector.aligned : "false"});
  ${a.registers}
  ${b.registers}
  ${
    join(
      pairs.map(([i, j]) => `var ${acc(i, j)} = subgroup_matrix_result<f32, ${sn}, ${sm}>();`),
      "  ",
    )
  }
  // k-tile kt is loaded into registers while tile kt − 1 is multiplied, then stored.
  for (var kt = 0u; kt <= k_tiles; kt++) {
    let k0 = kt * ${tk}u;
    if (kt < k_tiles) {
      ${a.load}
      ${b.load}
    }
    if (kt > 0u) {
      for (var kk = 0u; kk < ${tk}u; kk += ${sk}u) {
        ${join(math, "        ")}
      }
    }
    workgroupBarrier();
    if (kt < k_tiles) {
      ${a.store}
      ${b.store}
    }
    workgroupBarrier();
  }
  ${resultStores(t, io, activation, pairs)}
}`;
}

/**
 * The epilogue: each result matrix through the subgroup's scratch, then
 * stored by its invocations (bias, activation, edges as the other tilings):
 * vec4s on interior tiles where the io has them, else checked scalars.
 */
function resultStores(
  t: MatmulTiling,
  io: GemmIo,
  activation: Activation,
  pairs: (readonly [number, number])[],
): string {
  const { sm, sn, sg } = matrixOf(t);
  const base = `subgroup * ${sm * sn}u`;
  // Element e of the matrix at (e / N, e % N) from its first row and column (`row_m`, `col_m`).
  const scalar = `for (var e = lane; e < ${sm * sn}u; e += ${sg}u) {
    ${
    epilogue(
      { ...t, tm: 1, tn: 1 },
      io,
      activation,
      () => `row_m + e / ${sn}u`,
      () => `col_m + e % ${sn}u`,
      () => `scratch[${base} + e]`,
    )
  }
  }`;
  const vector = io.vector;
  const stores = vector
    ? `if (whole && ${vector.storeAligned}) {
    for (var e = lane * 4u; e < ${sm * sn}u; e += ${4 * sg}u) {
      let col = col_m + e % ${sn}u;
      let v = vec4<f32>(scratch[${base} + e], scratch[${base} + e + 1u], scratch[${base} + e + 2u], scratch[${base} + e + 3u]);
      let s = ${vector.biasVec ? `v + ${vector.biasVec("col")}` : "v"};
      ${vector.storeVec(`(row_m + e / ${sn}u)`, "col", activationVec4(activation, "s"))}
    }
  } else {
    ${scalar}
  }`
    : scalar;
  return pairs.map(([i, j]) =>
    `{ subgroupMatrixStore<row_major>(&scratch, ${base}, acc${i}_${j}, ${sn}u);
  workgroupBarrier();
  let row_m = tile_row + row0 + ${i * sm}u;
  let col_m = tile_col + col0 + ${j * sn}u;
  ${stores}
  workgroupBarrier(); }`
  ).join("\n  ");
}
