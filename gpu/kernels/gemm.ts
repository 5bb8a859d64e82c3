/**
 * The tiled GEMM code generator shared by matmul and the implicit-GEMM
 * convolutions: C[row, col] = Σ_k A[row, k]·B[k, col] with f32 accumulation,
 * then bias and activation. How A and B are read and C is written comes from
 * a {@link GemmIo}: strided loads for matmul, gathers with padding for a
 * convolution (so no im2col buffer is ever written).
 *
 * Two tilings, chosen per adapter (see `matmul_tuning.ts`):
 * - `register` / `interleaved`: every thread keeps a TM×TN block of C in
 *   registers and reads A and B straight from storage. Wins on CPU adapters.
 * - `shared`: the workgroup stages (TM·WGY)×TK and TK×(TN·WGX) tiles in
 *   workgroup memory. The usual winner on real GPUs.
 *
 * The generated kernel reads `p.m`, `p.n` and `p.k` from its uniforms and
 * calls the third dispatch dimension `z` (a batch, or a convolution group).
 */
import type { Gpu, MatmulTiling } from "../device.ts";
import { failLoopIterations } from "./loop_limit.ts";
import { type Activation, activationExpr, WGSL_MATH } from "./wgsl_math.ts";

/** How one GEMM kernel addresses its operands. Every hook returns WGSL. */
export interface GemmIo {
  /** Helper functions the hooks call (module scope). */
  prelude?: string;
  /** Statements at the start of `main`, after `z` is defined. */
  setup: string;
  /** Register tilings: statements that prepare A's row `i` (`row` is in range). */
  aRow(i: number, row: string): string;
  /** Register tilings: statements that prepare B's column `j` (`col` is in range). */
  bCol(j: number, col: string): string;
  /** Register tilings: statements at the top of each step of the k loop (`k` is the index). */
  kStep?: string;
  /** Register tilings: A[row i, k] as an f32 expression. */
  aLoad(i: number): string;
  /** Register tilings: B[k, col j] as an f32 expression. */
  bLoad(j: number): string;
  /** Shared tiling: A[row, k] as an f32 expression, row < m and k < k. */
  aAt(row: string, k: string): string;
  /** Shared tiling: B[k, col] as an f32 expression, k < k and col < n. */
  bAt(k: string, col: string): string;
  /** A statement storing the f32 value `v` at (row, col), both in range. */
  store(row: string, col: string, v: string): string;
  /** The bias of the element at (row, col) as an f32 expression, when there is one. */
  bias?(row: string, col: string): string;
}

/**
 * The same product computed as its transpose: rows become columns. A GEMM
 * with few columns and many rows (a convolution's output channels against
 * its positions) fills the tiles better this way, and on CPU adapters the
 * SIMD lanes then walk neighbouring positions.
 */
export function transposedIo(io: GemmIo): GemmIo {
  return {
    prelude: io.prelude,
    setup: io.setup,
    aRow: (i, row) => io.bCol(i, row),
    bCol: (j, col) => io.aRow(j, col),
    kStep: io.kStep,
    aLoad: (i) => io.bLoad(i),
    bLoad: (j) => io.aLoad(j),
    aAt: (row, k) => io.bAt(k, row),
    bAt: (k, col) => io.aAt(col, k),
    store: (row, col, v) => io.store(col, row, v),
    bias: io.bias && ((row, col) => io.bias!(col, row)),
  };
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** Stores acc[i][j] at (row(i), col(j)) through bias and activation, skipping edges. */
function epilogue(
  t: MatmulTiling,
  io: GemmIo,
  activation: Activation,
  row: (i: number) => string,
  col: (j: number) => string,
): string {
  const lines: string[] = [];
  for (let i = 0; i < t.tm; i++) {
    for (let j = 0; j < t.tn; j++) {
      const acc = `acc[${i * t.tn + j}]`;
      const v = io.bias ? `${acc} + ${io.bias("row", "col")}` : acc;
      lines.push(
        `{ let row = ${row(i)}; let col = ${col(j)};\n` +
          `    if (row < p.m && col < p.n) { ${
            io.store("row", "col", activationExpr(activation, v))
          } } }`,
      );
    }
  }
  return lines.join("\n  ");
}

function fmaBlock(t: MatmulTiling): string {
  const lines: string[] = [];
  for (let i = 0; i < t.tm; i++) {
    for (let j = 0; j < t.tn; j++) {
      lines.push(`acc[${i * t.tn + j}] = fma(a${i}, b${j}, acc[${i * t.tn + j}]);`);
    }
  }
  return lines.join("\n    ");
}

function registerWgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string {
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
  for (var k = 0u; k < p.k; k++) {
    ${io.kStep ?? ""}
    ${aLoads.join("\n    ")}
    ${bLoads.join("\n    ")}
    ${fmaBlock(t)}
  }
  ${epilogue(t, io, activation, row, col)}
}`;
}

function sharedWgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string {
  const { tm, tn, tk, wgx, wgy } = t;
  const bm = tm * wgy, bn = tn * wgx, threads = wgx * wgy;
  // Each thread's rows and columns are strided by the workgroup extent so
  // neighbouring threads read neighbouring shared-memory words.
  const aReads = range(tm).map((i) => `let a${i} = tile_a[kk * ${bm}u + lid.y + ${i * wgy}u];`);
  const bReads = range(tn).map((j) => `let b${j} = tile_b[kk * ${bn}u + lid.x + ${j * wgx}u];`);
  return `${WGSL_MATH}${io.prelude ?? ""}
var<workgroup> tile_a: array<f32, ${bm * tk}>; // [tk][bm]
var<workgroup> tile_b: array<f32, ${tk * bn}>; // [tk][bn]
@compute @workgroup_size(${wgx}, ${wgy})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let tile_row = wid.y * ${bm}u;
  let tile_col = wid.x * ${bn}u;
  let t = lid.y * ${wgx}u + lid.x;
  let z = wid.z;
  ${io.setup}
  var acc: array<f32, ${tm * tn}>;
  for (var k0 = 0u; k0 < p.k; k0 += ${tk}u) {
    for (var e = t; e < ${bm * tk}u; e += ${threads}u) {
      let r = e % ${bm}u; let kk = e / ${bm}u;
      let row = tile_row + r; let k = k0 + kk;
      var v = 0.0;
      if (row < p.m && k < p.k) { v = ${io.aAt("row", "k")}; }
      tile_a[kk * ${bm}u + r] = v;
    }
    for (var e = t; e < ${tk * bn}u; e += ${threads}u) {
      let col_in = e % ${bn}u; let kk = e / ${bn}u;
      let col = tile_col + col_in; let k = k0 + kk;
      var v = 0.0;
      if (col < p.n && k < p.k) { v = ${io.bAt("k", "col")}; }
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

/** The WGSL body (after the bindings header) of a GEMM kernel with tiling `t`. */
export function gemmWgsl(t: MatmulTiling, io: GemmIo, activation: Activation = "none"): string {
  return t.variant === "shared" ? sharedWgsl(t, io, activation) : registerWgsl(t, io, activation);
}

/** Workgroups to cover an m × n result with tiling `t`, `depth` deep. */
export function gemmGrid(
  t: MatmulTiling,
  m: number,
  n: number,
  depth: number,
): [number, number, number] {
  return [Math.ceil(n / (t.tn * t.wgx)), Math.ceil(m / (t.tm * t.wgy)), depth];
}

/**
 * Throws a clear error where a product's reduction over `k` would pass the
 * adapter's loop cap (see loop_limit.ts): one iteration per k, about two with
 * the shared-memory tiling (its tile loads loop too). `op` names the caller.
 */
export function checkGemmLoops(gpu: Gpu, k: number, tiling: MatmulTiling, op: string): void {
  const iterations = tiling.variant === "shared" ? 2 * k : k;
  if (iterations <= gpu.loopIterationLimit) return;
  failLoopIterations(
    gpu,
    iterations,
    op,
    `a reduction over K = ${k}`,
    "Use a smaller batch (a weight gradient's K is its rows) or a GPU adapter.",
  );
}
