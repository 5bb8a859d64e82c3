/**
 * The `blocked` GEMM tiling, written for real GPUs from what a WGSL SGEMM
 * probe found fast through Deno's WebGPU (several times small shared tiles):
 * - a large workgroup tile (TM·WGY × TN·WGX, such as 128×128 from 16×16
 *   threads with 8×8 results each), so every value loaded is used many times;
 * - A's tile stored transposed in workgroup memory ([k][row]) and B's as
 *   [k][col], both as vec4, so each step of the inner loop reads a thread's
 *   rows and columns with vec4 loads;
 * - each thread's rows and columns in groups of four, the groups strided by
 *   the workgroup extent, so neighbouring threads read neighbouring vec4s;
 * - one vec4 of padding per k-row of each tile: the transposed stores (k
 *   fastest across threads) then fall in different banks;
 * - global loads ordered along the operand's contiguous index (a warp reads
 *   consecutive addresses in every orientation: the transposed operands of a
 *   linear layer's backward are staged through workgroup memory);
 * - the inner k loop fully unrolled, one stage (the probe's double buffering
 *   did not pay), tiles kept in the storage dtype (f16 halves them).
 * Edges are handled in the tile loads (zeros) and the stores, never in the
 * inner loop. With f16 tiles the products may be summed in f16 over short
 * chunks of k (`GemmIo.f16Chunk`, the `f16Accumulation: "chunked"` option of
 * `initGpu`). TM and TN must be multiples of 4, and each tile's elements a
 * multiple of the workgroup's threads.
 */
import type { MatmulTiling } from "./settings.ts";
import { epilogue, type GemmIo, range, workgroupTileMain } from "./gemm_io.ts";
import { type Activation, WGSL_MATH } from "../wgsl/math.ts";

/** Bytes of workgroup memory a blocked tiling uses with tiles of `tileType`. */
export function blockedTileBytes(t: MatmulTiling, tileType: "f32" | "f16"): number {
  const vec4Bytes = tileType === "f16" ? 8 : 16;
  return t.tk * (t.tm * t.wgy / 4 + 1 + t.tn * t.wgx / 4 + 1) * vec4Bytes;
}

/**
 * Statements that stage one operand's tile: `loads` elements per thread,
 * element e of the tile at (outer, kk) with the contiguous index fastest.
 */
function tileLoads(opts: {
  tile: string;
  extent: number;
  tk: number;
  threads: number;
  alongK: boolean;
  stride: number;
  tileType: string;
  outer: string;
  limit: string;
  origin: string;
  kCount: string;
  at: (outer: string) => string;
}): string {
  const { tile, extent, tk, threads, alongK, stride, tileType } = opts;
  const [outerOf, kkOf] = alongK
    ? [`e / ${tk}u`, `e % ${tk}u`]
    : [`e % ${extent}u`, `e / ${extent}u`];
  return range(extent * tk / threads).map((l) =>
    `{ let e = t + ${l * threads}u;
      let o = ${outerOf}; let kk = ${kkOf};
      let ${opts.outer} = ${opts.origin} + o; let k = k0 + kk;
      var v = ${tileType}(0.0);
      if (${opts.outer} < ${opts.limit} && k < ${opts.kCount}) { v = ${tileType}(${
      opts.at(opts.outer)
    }); }
      ${tile}[kk * ${stride}u + o / 4u][o % 4u] = v; }`
  ).join("\n    ");
}

/** WGSL reading the vec4 at `group` (a WGSL index) of k-row `kk` of tile A or B. */
export type TileRead = (tile: "a" | "b", kk: number, group: string) => string;

/**
 * One unrolled step kk of the inner loop: vec4 reads of A and B, then TM·TN/4
 * vec4 FMAs into `into` (f32 accumulators, or the f16 partial sums of a chunk).
 */
function innerStep(
  t: MatmulTiling,
  kk: number,
  read: TileRead,
  math: "f32" | "f16",
  into: string,
): string {
  const gm = t.tm / 4, gn = t.tn / 4;
  const lines: string[] = [];
  for (let g = 0; g < gm; g++) {
    lines.push(`let a${g} = vec4<${math}>(${read("a", kk, `${g * t.wgy}u + lid.y`)});`);
  }
  for (let h = 0; h < gn; h++) {
    lines.push(`let b${h} = vec4<${math}>(${read("b", kk, `${h * t.wgx}u + lid.x`)});`);
  }
  for (let i = 0; i < t.tm; i++) {
    for (let h = 0; h < gn; h++) {
      const acc = `${into}[${i * gn + h}]`;
      lines.push(`${acc} = fma(vec4<${math}>(a${i >> 2}[${i & 3}]), b${h}, ${acc});`);
    }
  }
  return `{ ${lines.join("\n      ")} }`;
}

/**
 * The unrolled inner loop over a K-slice, reading the tiles through `read`
 * (a thread's row group g is g·WGY + lid.y, its column group h·WGX + lid.x).
 * With f16 chunks of length L, the products of each L consecutive k are
 * summed in f16 (`part`), and each chunk's sum is added to the f32
 * accumulators: error grows with L, not K. An f16 overflow in a chunk is an
 * inf that reaches the result.
 */
export function sliceMath(t: MatmulTiling, read: TileRead, chunk: number): string {
  const steps = range(t.tk);
  if (chunk === 0) return steps.map((kk) => innerStep(t, kk, read, "f32", "acc")).join("\n    ");
  const blocks = t.tm * t.tn / 4;
  const flush = `for (var i = 0u; i < ${blocks}u; i++) { acc[i] += vec4<f32>(part[i]); }`;
  const lines: string[] = [];
  for (let start = 0; start < t.tk; start += chunk) {
    // An explicit zero: Naga hoists a declared-only var and zeroes it once per invocation.
    lines.push(`{ var part = array<vec4<f16>, ${blocks}>();`);
    for (let kk = start; kk < Math.min(start + chunk, t.tk); kk++) {
      lines.push(innerStep(t, kk, read, "f16", "part"));
    }
    lines.push(`${flush} }`);
  }
  return lines.join("\n    ");
}

/** A thread's result rows and columns: group i/4 strided by the workgroup extent, four each. */
export function threadRow(t: MatmulTiling, i: number): string {
  return `tile_row + (${(i >> 2) * t.wgy}u + lid.y) * 4u + ${i & 3}u`;
}

/** See {@link threadRow}. */
export function threadCol(t: MatmulTiling, j: number): string {
  return `tile_col + (${(j >> 2) * t.wgx}u + lid.x) * 4u + ${j & 3}u`;
}

/** The WGSL of a thread's accumulator for result (i, j). */
export function accAt(t: MatmulTiling, i: number, j: number): string {
  return `acc[${i * (t.tn / 4) + (j >> 2)}][${j & 3}]`;
}

/** The WGSL body of a GEMM kernel with the blocked tiling `t`. */
export function blockedWgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string {
  const { tm, tn, tk, wgx, wgy } = t;
  const bm = tm * wgy, bn = tn * wgx, threads = wgx * wgy;
  const tileType = io.tileType ?? "f32";
  const strideA = bm / 4 + 1, strideB = bn / 4 + 1;
  const kCount = io.kCount ?? "p.k";
  const shared = { tk, threads, tileType, kCount };
  const aLoads = tileLoads({
    ...shared,
    tile: "tile_a",
    extent: bm,
    alongK: (io.aAlong ?? "k") === "k",
    stride: strideA,
    outer: "row",
    limit: "p.m",
    origin: "tile_row",
    at: (row) => io.aAt(row, "k"),
  });
  const bLoads = tileLoads({
    ...shared,
    tile: "tile_b",
    extent: bn,
    alongK: io.bAlong === "k",
    stride: strideB,
    outer: "col",
    limit: "p.n",
    origin: "tile_col",
    at: (col) => io.bAt("k", col),
  });
  const read: TileRead = (tile, kk, group) =>
    `tile_${tile}[${kk * (tile === "a" ? strideA : strideB)}u + ${group}]`;
  return `${WGSL_MATH}${io.prelude ?? ""}
var<workgroup> tile_a: array<vec4<${tileType}>, ${tk * strideA}>; // [tk][bm/4 + 1]
var<workgroup> tile_b: array<vec4<${tileType}>, ${tk * strideB}>; // [tk][bn/4 + 1]
${workgroupTileMain(t, io)}
  var acc: array<vec4<f32>, ${tm * tn / 4}>;
  for (var k0 = 0u; k0 < ${kCount}; k0 += ${tk}u) {
    ${aLoads}
    ${bLoads}
    workgroupBarrier();
    ${sliceMath(t, read, io.f16Chunk ?? 0)}
    workgroupBarrier();
  }
  ${
    epilogue(
      t,
      io,
      activation,
      (i) => threadRow(t, i),
      (j) => threadCol(t, j),
      (i, j) => accAt(t, i, j),
    )
  }
}`;
}
