/**
 * How row kernels (softmax, LayerNorm, cross-entropy: a reduction along each
 * row of a [rows, cols] view) map rows to threads. Long rows are reduced by a
 * workgroup of {@link REDUCE_THREADS} threads through workgroup memory; short
 * rows go one per thread, with no barrier at all.
 *
 * NOTE: on the CPU adapter a workgroup spends its time in barriers, so a
 * thread per row is faster there at every length up to 4096 (`rowSettings`
 * holds the switch-over length).
 *
 * On the workgroup paths a row gets `lanes` threads ({@link rowLanes}: about
 * four loads each, at most a workgroup), so a workgroup reduces several short
 * rows at once, and rows whose length is a multiple of 4 load vec4s
 * (row_width.ts): {@link rowPlan} picks both.
 *
 * The helpers write WGSL that reads the same in every layout: `row` is the
 * thread's row, `lane` its place among the row's threads, the row loop visits
 * its columns, `reduce_sum`/`reduce_max` combine partial results over the
 * row's threads (the identity for a thread that owns its row), and the row's
 * leader writes per-row results where `in_rows` holds.
 */
import type { Gpu } from "../../device/gpu.ts";
import { grid1d, WGSL_WORKGROUP_INDEX } from "../wgsl/grid.ts";
import { REDUCE_THREADS, WGSL_MAX_OR_NAN, WGSL_WORKGROUP_REDUCE } from "../wgsl/math.ts";
import { useSubgroups, WGSL_SUBGROUP_REDUCE } from "../wgsl/subgroups.ts";
import { defineTunerSettings, type TunerSettings } from "../../tuning/settings.ts";
import { type RowWidth, rowWidth } from "./row_width.ts";

/**
 * `"workgroup"`: a workgroup reduces each row through workgroup memory;
 * `"subgroup"`: the same, combining within subgroups first (GPUs with the
 * feature, see gpu/kernels/wgsl/subgroups.ts); `"thread"`: a thread owns a whole row.
 */
export type RowLayout = "workgroup" | "subgroup" | "thread";

/** The row kernels' tuning settings on one device (see {@link rowSettings}). */
export interface RowSettings {
  /** Rows of at most this many entries get a thread each; longer rows a workgroup. */
  threadRowMax: number;
  /** Load rows whose length is a multiple of 4 as vec4 (see row_width.ts); false: one entry per load. */
  vec4: boolean;
}

/**
 * The row kernels' settings of a device (`rowSettings.of(gpu).threadRowMax`).
 * Default 4096 on CPU adapters, where a thread per row is faster at every
 * length up to there, and 64 on GPUs, where long rows need a workgroup's
 * bandwidth. Column sums read it too (gpu/kernels/rows/reduce_columns.ts).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, rowSettings } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.equal(rowSettings.of(gpu).threadRowMax, gpu.adapterProfile.cpu ? 4096 : 64);
 * gpu.destroy();
 * ```
 */
export const rowSettings: TunerSettings<RowSettings> = defineTunerSettings(
  "rows",
  (gpu) => ({ threadRowMax: gpu.adapterProfile.cpu ? 4096 : 64, vec4: true }),
);

/** The layout for rows of `cols` entries on `gpu` (up to `threadRowMax`: a thread per row). */
export function rowLayout(gpu: Gpu, cols: number): RowLayout {
  if (cols <= rowSettings.of(gpu).threadRowMax) return "thread";
  return useSubgroups(gpu) ? "subgroup" : "workgroup";
}

/**
 * How a row kernel maps rows to threads (flat, so it spreads into a kernel
 * config): the layout, the threads per row (`lanes`: 1 for "thread", a power
 * of two up to {@link REDUCE_THREADS} otherwise, so a workgroup holds
 * REDUCE_THREADS / lanes rows) and the entries per load (`width`).
 */
export interface RowPlan {
  /** How partial results combine. */
  layout: RowLayout;
  /** Threads per row. */
  lanes: number;
  /** Entries per load: 4 (vec4) where the row length allows it. */
  width: RowWidth;
}

/**
 * Threads per row for rows of `units` loads in `layout`: about 4 loads per
 * thread, so short rows (e.g. 384 entries: 96 vec4, 32 threads each, 2 rows
 * per workgroup) do not leave most of a 64-thread workgroup idle; from 4 to
 * {@link REDUCE_THREADS}.
 */
export function rowLanes(layout: RowLayout, units: number): number {
  if (layout === "thread") return 1;
  let lanes = 4;
  while (lanes < REDUCE_THREADS && lanes * 4 < units) lanes *= 2;
  return lanes;
}

/** The {@link RowPlan} for rows of `cols` entries on `gpu`. */
export function rowPlan(gpu: Gpu, cols: number): RowPlan {
  const layout = rowLayout(gpu, cols);
  const width = rowSettings.of(gpu).vec4 ? rowWidth(cols) : 1;
  return { layout, lanes: rowLanes(layout, cols / width), width };
}

/** The dispatch grid for `rows` rows in a layout (at its full lanes) or plan (workgroups of {@link REDUCE_THREADS}). */
export function rowGrid(
  plan: RowLayout | Pick<RowPlan, "layout" | "lanes">,
  rows: number,
): [number, number] {
  const { layout, lanes } = typeof plan === "string"
    ? { layout: plan, lanes: REDUCE_THREADS }
    : plan;
  return grid1d(
    layout === "thread"
      ? Math.ceil(rows / REDUCE_THREADS)
      : Math.ceil(rows / (REDUCE_THREADS / lanes)),
  );
}

/**
 * WGSL helpers before `main`: `reduce_sum(v, lid)`/`reduce_max(v, lid)` over
 * each row's `lanes` threads (the whole workgroup by default), or their
 * one-thread identities (and `max_or_nan` either way).
 */
export function wgslRowReduce(layout: RowLayout, lanes: number = REDUCE_THREADS): string {
  if (layout === "thread") {
    return `${WGSL_MAX_OR_NAN}fn reduce_sum(v: f32, lid: u32) -> f32 { return v; }
fn reduce_max(v: f32, lid: u32) -> f32 { return v; }
`;
  }
  if (lanes === REDUCE_THREADS) {
    return layout === "subgroup" ? WGSL_SUBGROUP_REDUCE : WGSL_WORKGROUP_REDUCE;
  }
  return layout === "subgroup" ? wgslSubgroupLanesReduce(lanes) : wgslWorkgroupLanesReduce(lanes);
}

/** {@link wgslRowReduce} through workgroup memory over runs of `lanes` threads: a tree of log2(lanes) steps. */
function wgslWorkgroupLanesReduce(lanes: number): string {
  const reduce = (name: string, combine: (a: string, b: string) => string) =>
    `fn ${name}(v: f32, lid: u32) -> f32 {
  partial[lid] = v;
  workgroupBarrier();
  let lane = lid % ${lanes}u;
  for (var s = ${lanes / 2}u; s > 0u; s >>= 1u) {
    if (lane < s) { partial[lid] = ${combine("partial[lid]", "partial[lid + s]")}; }
    workgroupBarrier();
  }
  let r = partial[lid - lane];
  workgroupBarrier();
  return r;
}
`;
  return `${WGSL_MAX_OR_NAN}var<workgroup> partial: array<f32, ${REDUCE_THREADS}>;
${reduce("reduce_sum", (a, b) => `${a} + ${b}`)}${
    reduce("reduce_max", (a, b) => `max_or_nan(${a}, ${b})`)
  }`;
}

/**
 * {@link wgslRowReduce} through subgroups over runs of `lanes` threads: a
 * shuffle butterfly within runs of min(lanes, subgroup size) threads (every
 * thread ends with the same bits: each step adds the same two values), then,
 * where a row spans several subgroups, their results summed in order through
 * workgroup memory (same NOTE on consecutive subgroups as WGSL_SUBGROUP_REDUCE).
 */
function wgslSubgroupLanesReduce(lanes: number): string {
  return `${WGSL_MAX_OR_NAN}var<workgroup> partial: array<f32, ${REDUCE_THREADS}>;
fn combine(a: f32, b: f32, is_max: bool) -> f32 { return select(a + b, max_or_nan(a, b), is_max); }
fn reduce_lanes(v: f32, lid: u32, is_max: bool) -> f32 {
  let n = min(subgroupAdd(1u), ${lanes}u);
  var t = v;
  for (var k = n / 2u; k > 0u; k >>= 1u) { t = combine(t, subgroupShuffleXor(t, k), is_max); }
  if (lid % n == 0u) { partial[lid / n] = t; }
  workgroupBarrier();
  let first = (lid - lid % ${lanes}u) / n;
  var r = partial[first];
  for (var i = 1u; i < ${lanes}u / n; i++) { r = combine(r, partial[first + i], is_max); }
  workgroupBarrier();
  return r;
}
fn reduce_sum(v: f32, lid: u32) -> f32 { return reduce_lanes(v, lid, false); }
fn reduce_max(v: f32, lid: u32) -> f32 { return reduce_lanes(v, lid, true); }
`;
}

/**
 * WGSL in \`main\`: \`row\` (this thread's row), \`lane\` (its place among the
 * row's threads) and \`in_rows\` (false on threads past the last row, which
 * still run the reductions' barriers; their \`row\` is the last row, so reads
 * stay in bounds, and they write nothing). Where a whole workgroup shares
 * one row or a thread owns its row it returns past \`rows\` (a uniform field name).
 */
export function wgslRowIndex(
  layout: RowLayout,
  rows: string,
  lanes: number = REDUCE_THREADS,
): string {
  if (layout === "thread") {
    return `let row = ${WGSL_WORKGROUP_INDEX} * ${REDUCE_THREADS}u + lid;
  if (row >= p.${rows}) { return; }
  let lane = 0u;
  let in_rows = true;`;
  }
  if (lanes === REDUCE_THREADS) {
    return `let row = ${WGSL_WORKGROUP_INDEX};
  if (row >= p.${rows}) { return; }
  let lane = lid;
  let in_rows = true;`;
  }
  return `let slot = ${WGSL_WORKGROUP_INDEX} * ${REDUCE_THREADS / lanes}u + lid / ${lanes}u;
  let in_rows = slot < p.${rows};
  let row = min(slot, p.${rows} - 1u);
  let lane = lid % ${lanes}u;`;
}

/** WGSL loop header visiting this thread's share `j` of its row's `count` columns (none when not `in_rows`). */
export function wgslRowLoop(
  layout: RowLayout,
  count: string,
  lanes: number = REDUCE_THREADS,
): string {
  if (layout === "thread") return `for (var j = 0u; j < ${count}; j++)`;
  const end = lanes === REDUCE_THREADS ? count : `select(0u, ${count}, in_rows)`;
  return `for (var j = lane; j < ${end}; j += ${lanes}u)`;
}

/** WGSL condition that holds on the one thread of a row that writes its results (also check `in_rows`). */
export function wgslRowLeader(layout: RowLayout): string {
  return layout === "thread" ? "true" : "lane == 0u";
}
