/**
 * The embedding table's gradient on GPUs without scanning every id per
 * table element: the ids are first grouped by value (a stable counting sort
 * on the GPU, integers only), then each table element adds its id's rows in
 * row order. The old kernel (`scatterAddKernel`) reads all ids for each of
 * vocab·dim elements: O(vocab·dim·ids); this one O(ids·(dim + block)).
 *
 * Per pass of at most `IDS_PER_PASS` ids (lavapipe's loop cap), five dispatches:
 * 1. zero the counts ([vocab, blocks], blocks of {@link BLOCK_ROWS} rows);
 * 2. count each id per block (u32 atomics: the counts do not depend on order);
 * 3. an exclusive scan of the counts, id-major then block (one workgroup);
 * 4. place each row at its id's offset + its block's offset + its rank among
 *    the earlier rows of its block with the same id: each id's rows end up
 *    in row order, whatever order threads run in;
 * 5. each (id, d) adds g[row, d] over its id's rows in that order, in f32.
 * The additions happen in the order the old kernel makes them (rows
 * ascending), so f32 results are its bits, and runs repeat bit for bit.
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel } from "../device/kernel.ts";
import type { Shape } from "../base/shape.ts";
import { DeviceArray } from "../device/device_array.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./wgsl/grid.ts";

const WORKGROUP = 256;
/** Rows per block of the counting sort: a row's rank scans at most this many earlier rows. */
export const BLOCK_ROWS = 256;

const THREAD = `let t = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;`;

/** counts[i] = 0 for i < n. */
export const zeroCountsKernel = defineKernel({
  name: "embedding_grad_zero",
  bindings: (_: Record<string, never>) => [{ name: "counts", type: "u32", write: true }],
  uniforms: { n: "u32" },
  source: () =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD}
  if (t < p.n) { counts[t] = 0u; }
}`,
});

/** counts[id, block] += 1 for each row of the pass. */
export const countIdsKernel = defineKernel({
  name: "embedding_grad_count",
  bindings: (_: Record<string, never>) => [
    { name: "ids", type: "i32" },
    { name: "counts", type: "atomic<u32>", write: true },
  ],
  uniforms: { first: "u32", count: "u32", blocks: "u32" },
  source: () =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD}
  if (t >= p.count) { return; }
  let v = u32(ids[p.first + t]);
  atomicAdd(&counts[v * p.blocks + t / ${BLOCK_ROWS}u], 1u);
}`,
});

/** counts ← their exclusive prefix sums (n of them), one workgroup. */
export const scanCountsKernel = defineKernel({
  name: "embedding_grad_scan",
  bindings: (_: Record<string, never>) => [{ name: "counts", type: "u32", write: true }],
  uniforms: { n: "u32" },
  source: () =>
    `var<workgroup> sums: array<u32, ${WORKGROUP}>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(local_invocation_index) lid: u32) {
  let chunk = (p.n + ${WORKGROUP - 1}u) / ${WORKGROUP}u;
  let start = min(lid * chunk, p.n);
  let stop = min(start + chunk, p.n);
  var s = 0u;
  for (var i = start; i < stop; i++) { s += counts[i]; }
  sums[lid] = s;
  workgroupBarrier();
  if (lid == 0u) {
    var before = 0u;
    for (var k = 0u; k < ${WORKGROUP}u; k++) { let c = sums[k]; sums[k] = before; before += c; }
  }
  workgroupBarrier();
  var at = sums[lid];
  for (var i = start; i < stop; i++) { let c = counts[i]; counts[i] = at; at += c; }
}`,
});

/** order[offset(id, block) + rank] = row, for each row of the pass (rows relative to `first`). */
export const placeRowsKernel = defineKernel({
  name: "embedding_grad_place",
  bindings: (_: Record<string, never>) => [
    { name: "ids", type: "i32" },
    { name: "offsets", type: "u32" },
    { name: "order", type: "u32", write: true },
  ],
  uniforms: { first: "u32", count: "u32", blocks: "u32" },
  source: () =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD}
  if (t >= p.count) { return; }
  let v = ids[p.first + t];
  let block = t / ${BLOCK_ROWS}u;
  var rank = 0u;
  for (var r = block * ${BLOCK_ROWS}u; r < t; r++) {
    if (ids[p.first + r] == v) { rank++; }
  }
  order[offsets[u32(v) * p.blocks + block] + rank] = t;
}`,
});

/** grad[v, d] (+)= Σ over v's rows in row order of g[row, d], in f32. */
export const groupedSumKernel = defineKernel({
  name: "embedding_grad_sum",
  bindings: (c: { dtype: DType; out: DType }) => [
    { name: "g", type: c.dtype },
    { name: "offsets", type: "u32" },
    { name: "order", type: "u32" },
    { name: "grad", type: c.out, write: true },
  ],
  uniforms: {
    first: "u32",
    count: "u32",
    blocks: "u32",
    dim: "u32",
    vocab: "u32",
    accumulate: "u32",
  },
  source: () =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD}
  if (t >= p.vocab * p.dim) { return; }
  let v = t / p.dim;
  let d = t % p.dim;
  let start = offsets[v * p.blocks];
  let stop = select(p.count, offsets[(v + 1u) * p.blocks], v + 1u < p.vocab);
  var acc = select(0.0, ld_grad(t), p.accumulate != 0u);
  for (var k = start; k < stop; k++) { acc += ld_g((p.first + order[k]) * p.dim + d); }
  st_grad(t, acc);
}`,
});

/**
 * Adds (`accumulate`) or writes into `grad` ([vocab, dim], `out` dtype) the
 * sums of g's rows `first` .. `first + count` grouped by id, as above.
 */
export function launchGroupedScatterInto(
  g: DeviceArray,
  ids: DeviceArray,
  rows: { first: number; count: number; accumulate: boolean },
  grad: DeviceArray,
): void {
  const gpu = g.gpu, [vocab, dim] = grad.shape as Shape;
  const { first, count } = rows;
  const blocks = Math.ceil(count / BLOCK_ROWS), n = vocab * blocks;
  const counts = DeviceArray.empty([n], "i32", gpu);
  const order = DeviceArray.empty([Math.max(count, 1)], "i32", gpu);
  const perRow = grid1d(Math.ceil(count / WORKGROUP));
  gpu.dispatch(
    gpu.kernel(zeroCountsKernel, {}),
    { counts },
    { n },
    grid1d(Math.ceil(n / WORKGROUP)),
  );
  gpu.dispatch(gpu.kernel(countIdsKernel, {}), { ids, counts }, { first, count, blocks }, perRow);
  gpu.dispatch(gpu.kernel(scanCountsKernel, {}), { counts }, { n }, [1]);
  const offsets = counts;
  gpu.dispatch(
    gpu.kernel(placeRowsKernel, {}),
    { ids, offsets, order },
    { first, count, blocks },
    perRow,
  );
  gpu.dispatch(
    gpu.kernel(groupedSumKernel, { dtype: g.dtype, out: grad.dtype }),
    { g, offsets, order, grad },
    { first, count, blocks, dim, vocab, accumulate: rows.accumulate ? 1 : 0 },
    grid1d(Math.ceil((vocab * dim) / WORKGROUP)),
  );
  counts.dispose();
  order.dispose();
}
