/**
 * The `register`, `interleaved` and `shared` GEMM tilings (CPU adapters):
 * - `register` / `interleaved`: every thread keeps a TM×TN block of C in
 *   registers and reads A and B straight from storage;
 * - `shared`: the workgroup stages (TM·WGY)×TK and TK×(TN·WGX) tiles in
 *   workgroup memory, scalar reads.
 */
import type { MatmulTiling } from "./settings.ts";
import { type Activation, WGSL_MATH } from "../wgsl/math.ts";
import { epilogue, type GemmIo, range, workgroupTileMain } from "./gemm_io.ts";

function fmaBlock(t: MatmulTiling): string {
  const lines: string[] = [];
  for (let i = 0; i < t.tm; i++) {
    for (let j = 0; j < t.tn; j++) {
      lines.push(`acc[${i * t.tn + j}] = fma(a${i}, b${j}, acc[${i * t.tn + j}]);`);
    }
  }
  return lines.join("\n    ");
}

/** The WGSL body of a GEMM kernel with a register or interleaved tiling. */
export function registerWgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string {
  const { tm, tn, wgx, wgy } = t;
  // "register": a thread owns a contiguous TM×TN block. "interleaved": its rows
  // and columns are strided by the workgroup extent, so neighbouring threads
  // (SIMD lanes on a CPU adapter) read neighbouring addresses.
  const interleaved = t.variant === "interleaved";
  const row = (i: number) => interleaved ? `row0 + ${i * wgy}u` : `row0 + ${i}u`;
  const col = (j: number) => interleaved ? `col0 + ${j * wgx}u` : `col0 + ${j}u`;
  const firstRow = interleaved ? `wid.y * ${tm * wgy}u + lid.y` : `gid.y * ${tm}u`;
  const firstCol = interleaved ? `wid.x * ${tn * wgx}u + lid.x` : `gid.x * ${tn}u`;
  // Edge threads clamp their rows and columns into range and skip
  // out-of-range stores, so the inner loop has no branches.
  const rows = range(tm).map((i) => io.aRow(i, `min(${row(i)}, p.m - 1u)`));
  const cols = range(tn).map((j) => io.bCol(j, `min(${col(j)}, p.n - 1u)`));
  const aLoads = range(tm).map((i) => `let a${i} = ${io.aLoad(i)};`);
  const bLoads = range(tn).map((j) => `let b${j} = ${io.bLoad(j)};`);
  return `${WGSL_MATH}${io.prelude ?? ""}
@compute @workgroup_size(${wgx}, ${wgy})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let row0 = ${firstRow};
  let col0 = ${firstCol};
  if (row0 >= p.m || col0 >= p.n) { return; }
  let z = gid.z;
  ${io.setup}
  ${rows.join("\n  ")}
  ${cols.join("\n  ")}
  var acc: array<f32, ${tm * tn}>;
  for (var k = 0u; k < ${io.kCount ?? "p.k"}; k++) {
    ${io.kStep ?? ""}
    ${aLoads.join("\n    ")}
    ${bLoads.join("\n    ")}
    ${fmaBlock(t)}
  }
  ${epilogue(t, io, activation, row, col)}
}`;
}

/** The WGSL body of a GEMM kernel with the shared tiling. */
export function sharedWgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string {
  const { tm, tn, tk, wgx, wgy } = t;
  const bm = tm * wgy, bn = tn * wgx, threads = wgx * wgy;
  // Each thread's rows and columns are strided by the workgroup extent so
  // neighbouring threads read neighbouring shared-memory words.
  const aReads = range(tm).map((i) => `let a${i} = tile_a[kk * ${bm}u + lid.y + ${i * wgy}u];`);
  const bReads = range(tn).map((j) => `let b${j} = tile_b[kk * ${bn}u + lid.x + ${j * wgx}u];`);
  const kCount = io.kCount ?? "p.k";
  return `${WGSL_MATH}${io.prelude ?? ""}
var<workgroup> tile_a: array<f32, ${bm * tk}>; // [tk][bm]
var<workgroup> tile_b: array<f32, ${tk * bn}>; // [tk][bn]
${workgroupTileMain(t, io)}
  var acc: array<f32, ${tm * tn}>;
  for (var k0 = 0u; k0 < ${kCount}; k0 += ${tk}u) {
    for (var e = t; e < ${bm * tk}u; e += ${threads}u) {
      let r = e % ${bm}u; let kk = e / ${bm}u;
      let row = tile_row + r; let k = k0 + kk;
      var v = 0.0;
      if (row < p.m && k < ${kCount}) { v = ${io.aAt("row", "k")}; }
      tile_a[kk * ${bm}u + r] = v;
    }
    for (var e = t; e < ${tk * bn}u; e += ${threads}u) {
      let col_in = e % ${bn}u; let kk = e / ${bn}u;
      let col = tile_col + col_in; let k = k0 + kk;
      var v = 0.0;
      if (col < p.n && k < ${kCount}) { v = ${io.bAt("k", "col")}; }
      tile_b[kk * ${bn}u + col_in] = v;
    }
    workgroupBarrier();
    for (var kk = 0u; kk < ${tk}u; kk++) {
      ${aReads.join("\n      ")}
      ${bReads.join("\n      ")}
      ${fmaBlock(t)}
    }
    workgroupBarrier();
  }
  ${
    epilogue(
      t,
      io,
      activation,
      (i) => `tile_row + lid.y + ${i * wgy}u`,
      (j) => `tile_col + lid.x + ${j * wgx}u`,
    )
  }
}`;
}
