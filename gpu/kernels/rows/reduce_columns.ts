/**
 * Column reductions at bandwidth: sums down the rows of a [rows, cols] view
 * (a bias gradient, LayerNorm's γ/β gradients) in two coalesced stages.
 *
 * Stage 1: a workgroup takes a block of rows across {@link COLUMN_WIDTH}
 * contiguous columns, its threads as {@link COLUMN_LANES} lanes of that
 * many columns (lane l reads rows l, l + LANES, ...), so neighbouring
 * threads read neighbouring addresses; the lanes' sums are added in lane
 * order and written as one f32 partial per (block, column). Stage 2 sums the
 * partials of each column, in block order, with the same kernel (one block
 * of all the partials). Every order is fixed, so a run repeats bit for bit.
 *
 * Today's kernels (a workgroup per column striding by `cols`) read one
 * element per row per workgroup: on a GPU each load is its own memory
 * transaction. Those stay on CPU adapters, where a thread per column walks
 * its rows alone (see `columnBlocksFor`).
 */
import type { Gpu } from "../../device/gpu.ts";
import type { DType } from "../../base/dtype.ts";
import { defineKernel } from "../../device/kernel.ts";
import { DeviceArray } from "../../device/device_array.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "../wgsl/grid.ts";
import { rowSettings } from "./row_layout.ts";

/** Contiguous columns per workgroup (one per thread of a lane). */
export const COLUMN_WIDTH = 64;
/** Lanes of rows per workgroup: COLUMN_WIDTH × COLUMN_LANES threads. */
export const COLUMN_LANES = 4;
/** Stage 1 aims at about this many blocks of rows (so stage 2 sums at most ~this many partials). */
const TARGET_BLOCKS = 128;
/** The fewest rows a block has (shorter blocks only add partials). */
const MIN_BLOCK_ROWS = 64;

/** The blocks of rows of a column reduction over `rows` rows. */
export interface ColumnBlocks {
  /** Rows per block (the last may have fewer). */
  blockRows: number;
  /** Blocks: partials per column. */
  blocks: number;
}

/** Stage 1's blocks for `rows` rows (at least 1 block). */
export function columnBlocks(rows: number): ColumnBlocks {
  const blockRows = Math.max(MIN_BLOCK_ROWS, Math.ceil(rows / TARGET_BLOCKS));
  return { blockRows, blocks: Math.max(1, Math.ceil(rows / blockRows)) };
}

/**
 * Whether a sum down `rows` rows of `cols` columns runs in two coalesced
 * stages on `gpu`: on GPUs (the adapter profile), for rows a workgroup would
 * otherwise stride over (past `rowSettings`' `threadRowMax`) and at least half a
 * workgroup of columns. CPU adapters keep a thread per column.
 */
export function columnBlocksFor(gpu: Gpu, rows: number, cols: number): boolean {
  return !gpu.adapterProfile.cpu && rows > rowSettings.of(gpu).threadRowMax &&
    cols >= COLUMN_WIDTH / 2;
}

/** One accumulator of a column kernel: its name and the f32 it adds for element `i` of row `r`. */
export interface ColumnTerm {
  readonly name: string;
  readonly value: string;
}

/**
 * The WGSL `main` of a column kernel: workgroup → (column group, block,
 * outer index), each thread sums `terms` over its lane's rows of the block
 * (element index `i`, row `r` within the outer index, column `col`), the
 * lanes are added in order, and `store(total, term, k)` writes each term's
 * total (a WGSL expression) as the (outer, block, column) partial `k`.
 * Uniforms used: outer, rows, cols, block_rows, blocks, groups.
 */
export function wgslColumnMain(
  terms: readonly ColumnTerm[],
  store: (total: string, term: ColumnTerm, k: string) => string,
): string {
  const lanes = terms.map((t) =>
    `var<workgroup> lane_${t.name}: array<f32, ${COLUMN_WIDTH * COLUMN_LANES}>;`
  );
  return `${lanes.join("\n")}
@compute @workgroup_size(${COLUMN_WIDTH * COLUMN_LANES})
fn main(${WGSL_GRID_BUILTINS}) {
  let wg = ${WGSL_WORKGROUP_INDEX};
  if (wg >= p.groups * p.blocks * p.outer) { return; }
  let col = (wg % p.groups) * ${COLUMN_WIDTH}u + lid % ${COLUMN_WIDTH}u;
  let block = (wg / p.groups) % p.blocks;
  let o = wg / (p.groups * p.blocks);
  let first = block * p.block_rows;
  let end = min(first + p.block_rows, p.rows);
${terms.map((t) => `  var ${t.name} = 0.0;`).join("\n")}
  if (col < p.cols) {
    for (var r = first + lid / ${COLUMN_WIDTH}u; r < end; r += ${COLUMN_LANES}u) {
      let i = (o * p.rows + r) * p.cols + col;
${terms.map((t) => `      ${t.name} += ${t.value};`).join("\n")}
    }
  }
${terms.map((t) => `  lane_${t.name}[lid] = ${t.name};`).join("\n")}
  workgroupBarrier();
  if (lid < ${COLUMN_WIDTH}u && col < p.cols) {
    let k = (o * p.blocks + block) * p.cols + col;
${
    terms.map((t) => {
      const sum = Array.from(
        { length: COLUMN_LANES },
        (_, l) => `lane_${t.name}[lid + ${l * COLUMN_WIDTH}u]`,
      ).join(" + ");
      return `    ${store(`(${sum})`, t, "k")}`;
    }).join("\n")
  }
  }
}`;
}

/** The uniforms and grid of a column kernel over [outer, rows, cols] in `blocks`. */
export function columnDispatch(
  outer: number,
  rows: number,
  cols: number,
  { blockRows, blocks }: ColumnBlocks,
): {
  uniforms: {
    outer: number;
    rows: number;
    cols: number;
    block_rows: number;
    blocks: number;
    groups: number;
  };
  grid: [number, number];
} {
  const groups = Math.ceil(cols / COLUMN_WIDTH);
  return {
    uniforms: { outer, rows, cols, block_rows: blockRows, blocks, groups },
    grid: grid1d(groups * blocks * outer),
  };
}

/** Σ over the rows of each [rows, cols] slab of src (from `offset`), times `scale`, per block. */
export const columnSumKernel = defineKernel({
  name: "column_sum",
  bindings: (c: { dtype: DType; out: DType }) => [
    { name: "src", type: c.dtype },
    { name: "dst", type: c.out, write: true },
  ],
  uniforms: {
    outer: "u32",
    rows: "u32",
    cols: "u32",
    block_rows: "u32",
    blocks: "u32",
    groups: "u32",
    offset: "u32",
    scale: "f32",
  },
  // Each column's total is stored by its own thread: st_ keeps a bf16 neighbour's half.
  source: () =>
    wgslColumnMain(
      [{ name: "s", value: "ld_src(p.offset + i)" }],
      (total, _, k) => `st_dst(${k}, ${total} * p.scale);`,
    ),
});

/**
 * Sums `src` viewed as [outer, rows, cols] over its rows into `dst`
 * ([outer, cols], times `scale`) in two stages: f32 partials per block of
 * rows, then their sum in block order. `offset` skips that many elements of
 * `src`. Any shape (a forced path in tests); `columnBlocksFor` says where it
 * pays. No autograd.
 */
export function launchColumnSumInto(
  src: DeviceArray,
  view: { outer: number; rows: number; cols: number; offset?: number },
  dst: DeviceArray,
  scale = 1,
): void {
  const { outer, rows, cols } = view;
  if (outer * cols === 0) return;
  const blocks = columnBlocks(rows);
  const partials = DeviceArray.empty([outer * blocks.blocks * cols], "f32", src.gpu);
  columnSumStage(src, { outer, rows, cols }, blocks, partials, 1, view.offset ?? 0);
  launchPartialsSumInto(partials, { outer, rows: blocks.blocks, cols }, dst, scale);
  partials.dispose();
}

/**
 * Stage 2: sums the f32 `partials` ([outer, rows, cols] from `offset`) over
 * their rows in order into `dst` ([outer, cols], times `scale`), one block.
 */
export function launchPartialsSumInto(
  partials: DeviceArray,
  view: { outer: number; rows: number; cols: number; offset?: number },
  dst: DeviceArray,
  scale = 1,
): void {
  const all = { blockRows: view.rows, blocks: 1 };
  columnSumStage(partials, view, all, dst, scale, view.offset ?? 0);
}

/** One dispatch of {@link columnSumKernel}. */
function columnSumStage(
  src: DeviceArray,
  view: { outer: number; rows: number; cols: number },
  blocks: ColumnBlocks,
  dst: DeviceArray,
  scale: number,
  offset: number,
): void {
  const kernel = src.gpu.kernel(columnSumKernel, { dtype: src.dtype, out: dst.dtype });
  const { uniforms, grid } = columnDispatch(view.outer, view.rows, view.cols, blocks);
  src.gpu.dispatch(kernel, { src, dst }, { ...uniforms, offset, scale }, grid);
}
