/**
 * What every GEMM tiling shares: how a kernel addresses its operands
 * ({@link GemmIo}: strided loads for matmul, gathers for a convolution) and
 * how it stores its results (bias, activation, edges).
 */
import type { MatmulTiling } from "./settings.ts";
import { type Activation, activationExpr } from "../wgsl/math.ts";

/** How one GEMM kernel addresses its operands. Every hook returns WGSL. */
export interface GemmIo {
  /** Helper functions the hooks call (module scope). */
  prelude?: string;
  /** Statements at the start of `main`, after `z` is defined. */
  setup: string;
  /**
   * The length of the reduction this workgroup sums, as WGSL (default `p.k`):
   * a slice of a split reduction (split-K) may be shorter than the others.
   */
  kCount?: string;
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
  /**
   * Blocked tiling: the storage dtype of A and B when both share it (f16 tiles
   * halve workgroup memory and its traffic); default f32.
   */
  tileType?: "f32" | "f16";
  /**
   * Blocked tiling with f16 tiles: sum the products of each run of this many
   * k in f16 before adding them to the f32 accumulators (0, the default: f32
   * math throughout). Must divide the tiling's TK.
   */
  f16Chunk?: number;
  /**
   * Blocked tiling: along which index neighbouring A elements sit in memory
   * (`"k"`: rows are contiguous, as x in x·Wᵀ; `"row"`: A is read
   * transposed). Neighbouring threads then load neighbouring addresses.
   * Only speed depends on it. Default `"k"`.
   */
  aAlong?: "k" | "row";
  /** Blocked tiling: the same for B (`"col"`: B's rows are contiguous; `"k"`: B is read transposed). Default `"col"`. */
  bAlong?: "k" | "col";
  /**
   * Vec4 tiling: operands bound as arrays of vec4 (`aAt`, `bAt` and `store`
   * then pick a component). Without it the vec4 tiling generates the blocked
   * kernel of the same shape (a convolution's gathers have no vec4 form).
   */
  vector?: GemmVectorIo;
}

/** Vec4 access to a GEMM's operands, along the index `aAlong` / `bAlong` names. */
export interface GemmVectorIo {
  /** WGSL bool: A and B may be read as aligned vec4s along their contiguous index. */
  aligned: string;
  /** A's four elements from (row, k) along its contiguous index, as vec4<f32>. */
  aVec(row: string, k: string): string;
  /** B's four elements from (k, col) along its contiguous index, as vec4<f32>. */
  bVec(k: string, col: string): string;
  /** WGSL bool: results may be stored as aligned vec4s along columns. */
  storeAligned: string;
  /** A statement storing the vec4<f32> `v` at (row, col..col + 3), all in range. */
  storeVec(row: string, col: string, v: string): string;
  /** The bias of columns col..col + 3 as vec4<f32>, when there is one. */
  biasVec?(col: string): string;
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
    kCount: io.kCount,
    aRow: (i, row) => io.bCol(i, row),
    bCol: (j, col) => io.aRow(j, col),
    kStep: io.kStep,
    aLoad: (i) => io.bLoad(i),
    bLoad: (j) => io.aLoad(j),
    aAt: (row, k) => io.bAt(k, row),
    bAt: (k, col) => io.aAt(col, k),
    store: (row, col, v) => io.store(col, row, v),
    bias: io.bias && ((row, col) => io.bias!(col, row)),
    tileType: io.tileType,
    f16Chunk: io.f16Chunk,
    aAlong: io.bAlong === "k" ? "k" : "row",
    bAlong: io.aAlong === "row" ? "col" : "k",
  };
}

/** `[0, 1, …, n − 1]`: the generators unroll loops over it. */
export const range = (n: number): number[] => Array.from({ length: n }, (_, i) => i);

/**
 * Stores the thread's result (i, j), `accAt(i, j)` in WGSL, at (row(i, j), col(j, i))
 * through bias and activation, skipping rows and columns out of range.
 */
export function epilogue(
  t: MatmulTiling,
  io: GemmIo,
  activation: Activation,
  row: (i: number, j: number) => string,
  col: (j: number, i: number) => string,
  accAt: (i: number, j: number) => string = (i, j) => `acc[${i * t.tn + j}]`,
): string {
  const lines: string[] = [];
  for (let i = 0; i < t.tm; i++) {
    for (let j = 0; j < t.tn; j++) {
      const acc = accAt(i, j);
      const v = io.bias ? `${acc} + ${io.bias("row", "col")}` : acc;
      lines.push(
        `{ let row = ${row(i, j)}; let col = ${col(j, i)};\n` +
          `    if (row < p.m && col < p.n) { ${
            io.store("row", "col", activationExpr(activation, v))
          } } }`,
      );
    }
  }
  return lines.join("\n  ");
}

/**
 * The start of `main` for the tilings that stage workgroup tiles (shared,
 * blocked): workgroup size, the tile's first row and column, the thread's
 * index `t` in the workgroup, `z`, then the operands' setup.
 */
export function workgroupTileMain(t: MatmulTiling, io: GemmIo): string {
  return `@compute @workgroup_size(${t.wgx}, ${t.wgy})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let tile_row = wid.y * ${t.tm * t.wgy}u;
  let tile_col = wid.x * ${t.tn * t.wgx}u;
  let t = lid.y * ${t.wgx}u + lid.x;
  let z = wid.z;
  ${io.setup}`;
}
