/**
 * How row kernels (softmax, LayerNorm, cross-entropy: a reduction along each
 * row of a [rows, cols] view) map rows to threads. Long rows are reduced by a
 * workgroup of {@link REDUCE_THREADS} threads through workgroup memory; short
 * rows go one per thread, with no barrier at all.
 *
 * NOTE: on the CPU adapter a workgroup spends its time in barriers: a
 * 64-thread workgroup per 32-entry attention row took 24 ms for [128, 32, 32],
 * a thread per row about 1 ms; LayerNorm, softmax and cross-entropy
 * (forward + backward) ran 2–8x faster with a thread per row at every length
 * from 65 to 4096 (`rowSettings` holds the switch-over length).
 *
 * The helpers write WGSL that reads the same in both layouts: `row` is the
 * thread's row, `ROW_LOOP` visits its columns, `reduce_sum`/`reduce_max`
 * combine partial results (the identity for a thread that owns its row), and
 * the row's leader writes per-row results.
 */
import type { Gpu } from "../device.ts";
import { grid1d, WGSL_WORKGROUP_INDEX } from "./grid.ts";
import { REDUCE_THREADS, WGSL_MAX_OR_NAN, WGSL_WORKGROUP_REDUCE } from "./wgsl_math.ts";
import { useSubgroups, WGSL_SUBGROUP_REDUCE } from "./subgroups.ts";
import { defineTunerSettings, type TunerSettings } from "../tuners.ts";

/**
 * `"workgroup"`: a workgroup reduces each row through workgroup memory;
 * `"subgroup"`: the same, combining within subgroups first (GPUs with the
 * feature, see gpu/kernels/subgroups.ts); `"thread"`: a thread owns a whole row.
 */
export type RowLayout = "workgroup" | "subgroup" | "thread";

/** The row kernels' tuning settings on one device (see {@link rowSettings}). */
export interface RowSettings {
  /** Rows of at most this many entries get a thread each; longer rows a workgroup. */
  threadRowMax: number;
}

/**
 * The row kernels' settings of a device (`rowSettings.of(gpu).threadRowMax`).
 * Default 4096 on CPU adapters, where a thread per row was faster at every
 * length measured (2–8x, up to 4096), and 64 on GPUs, where long rows need
 * a workgroup's bandwidth. Column sums read it too (gpu/kernels/reduce_columns.ts).
 *
 * @example
 * ```ts
 * import { initGpu, rowSettings } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * console.assert(rowSettings.of(gpu).threadRowMax === (gpu.adapterProfile.cpu ? 4096 : 64));
 * gpu.destroy();
 * ```
 */
export const rowSettings: TunerSettings<RowSettings> = defineTunerSettings(
  "rows",
  (gpu) => ({ threadRowMax: gpu.adapterProfile.cpu ? 4096 : 64 }),
);

/** The layout for rows of `cols` entries on `gpu` (up to `threadRowMax`: a thread per row). */
export function rowLayout(gpu: Gpu, cols: number): RowLayout {
  if (cols <= rowSettings.of(gpu).threadRowMax) return "thread";
  return useSubgroups(gpu) ? "subgroup" : "workgroup";
}

/** The dispatch grid for `rows` rows in `layout` (workgroups of {@link REDUCE_THREADS}). */
export function rowGrid(layout: RowLayout, rows: number): [number, number] {
  return grid1d(layout === "thread" ? Math.ceil(rows / REDUCE_THREADS) : rows);
}

/** WGSL helpers before `main`: the workgroup reductions, or their one-thread identities (and `max_or_nan` either way). */
export function wgslRowReduce(layout: RowLayout): string {
  if (layout === "subgroup") return WGSL_SUBGROUP_REDUCE;
  return layout === "workgroup"
    ? WGSL_WORKGROUP_REDUCE
    : `${WGSL_MAX_OR_NAN}fn reduce_sum(v: f32, lid: u32) -> f32 { return v; }
fn reduce_max(v: f32, lid: u32) -> f32 { return v; }
`;
}

/** WGSL in `main`: `let row = ...;`, returning when past `rows` (a uniform field name). */
export function wgslRowIndex(layout: RowLayout, rows: string): string {
  const row = layout === "thread"
    ? `${WGSL_WORKGROUP_INDEX} * ${REDUCE_THREADS}u + lid`
    : WGSL_WORKGROUP_INDEX;
  return `let row = ${row};
  if (row >= p.${rows}) { return; }`;
}

/** WGSL loop header visiting this thread's share of columns `j` < `count`. */
export function wgslRowLoop(layout: RowLayout, count: string): string {
  return layout === "thread"
    ? `for (var j = 0u; j < ${count}; j++)`
    : `for (var j = lid; j < ${count}; j += ${REDUCE_THREADS}u)`;
}

/** WGSL condition that holds on the one thread that writes a row's results. */
export function wgslRowLeader(layout: RowLayout): string {
  return layout === "thread" ? "true" : "lid == 0u";
}
