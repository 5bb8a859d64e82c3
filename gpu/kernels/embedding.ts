/**
 * Embedding lookup (a gather of rows) and its backward (a scatter-add of
 * rows). WGSL has no float atomics, so the backward computes each output
 * element of the table gradient by scanning the ids: O(vocab · dim · ids),
 * fine for the character- and class-sized tables on CPU adapters; GPUs group
 * the ids first (embedding_grad.ts), with the same f32 sums in the same order.
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel } from "../device/kernel.ts";
import type { Shape } from "../base/shape.ts";
import { DeviceArray } from "../device/device_array.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./wgsl/grid.ts";
import { launchGroupedScatterInto } from "./embedding_grad.ts";
import { movedType, moveGrid, wgslMoveMain } from "./wgsl/move_elements.ts";

const WORKGROUP = 256;

/** out[r, d] = table[ids[r], d]. */
export const gatherKernel = defineKernel({
  name: "embedding_gather",
  bindings: (c: { dtype: DType }) => [
    { name: "table", type: movedType(c.dtype) },
    { name: "ids", type: "i32" },
    { name: "out", type: movedType(c.dtype), write: true },
  ],
  uniforms: { n: "u32", dim: "u32" },
  source: ({ dtype }) =>
    `fn source_index(i: u32) -> u32 { return u32(ids[i / p.dim]) * p.dim + i % p.dim; }
${wgslMoveMain(dtype, "table", "out", "p.n * p.dim")}`,
});

/**
 * Ids one scatter-add dispatch walks. NOTE: lavapipe stops a shader
 * invocation after 65535 loop iterations, silently, so a batch of more ids is
 * summed in several dispatches, each adding to the last.
 */
export const IDS_PER_PASS = 16384;

/** grad[v, d] (+)= Σ over r in [first, first + count) with ids[r] = v of g[r, d], in f32. */
export const scatterAddKernel = defineKernel({
  name: "embedding_scatter_add",
  bindings: (c: { dtype: DType; out: DType }) => [
    { name: "g", type: c.dtype },
    { name: "ids", type: "i32" },
    { name: "grad", type: c.out, write: true },
  ],
  uniforms: { first: "u32", count: "u32", dim: "u32", vocab: "u32", accumulate: "u32" },
  source: () =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  if (i >= p.vocab * p.dim) { return; }
  let v = i32(i / p.dim);
  let d = i % p.dim;
  var acc = select(0.0, ld_grad(i), p.accumulate != 0u);
  for (var r = p.first; r < p.first + p.count; r++) {
    if (ids[r] == v) { acc += ld_g(r * p.dim + d); }
  }
  st_grad(i, acc);
}`,
});

/** Rows of `table` ([vocab, dim]) picked by `ids` (i32), shaped `[...ids.shape, dim]`. */
export function launchGather(table: DeviceArray, ids: DeviceArray): DeviceArray {
  const dim = table.shape[1];
  const out = DeviceArray.empty([...ids.shape, dim] as Shape, table.dtype, table.gpu);
  const total = ids.size * dim;
  if (total === 0) return out;
  const kernel = table.gpu.kernel(gatherKernel, { dtype: table.dtype });
  table.gpu.dispatch(
    kernel,
    { table, ids, out },
    { n: ids.size, dim },
    moveGrid(table.dtype, total),
  );
  return out;
}

/**
 * The table gradient from `g` ([...ids.shape, dim]), in `out` dtype: on GPUs
 * (the adapter profile) with the ids grouped first, on CPU adapters by
 * scanning them per element. Same sums, same order, same bits in f32.
 */
export function launchScatterAdd(
  g: DeviceArray,
  ids: DeviceArray,
  tableShape: Shape,
  out: DType,
): DeviceArray {
  const [vocab, dim] = tableShape;
  const grad = DeviceArray.empty(tableShape, out, g.gpu);
  if (vocab * dim === 0) return grad;
  const kernel = g.gpu.kernel(scatterAddKernel, { dtype: g.dtype, out });
  const passes = Math.max(1, Math.ceil(ids.size / IDS_PER_PASS));
  const grouped = !g.gpu.adapterProfile.cpu && ids.size > 0;
  for (let pass = 0; pass < passes; pass++) {
    const first = pass * IDS_PER_PASS;
    if (grouped) {
      const count = Math.min(IDS_PER_PASS, ids.size - first);
      launchGroupedScatterInto(g, ids, { first, count, accumulate: pass > 0 }, grad);
      continue;
    }
    g.gpu.dispatch(
      kernel,
      { g, ids, grad },
      {
        first,
        count: Math.min(IDS_PER_PASS, ids.size - first),
        dim,
        vocab,
        accumulate: pass > 0 ? 1 : 0,
      },
      grid1d(Math.ceil((vocab * dim) / WORKGROUP)),
    );
  }
  return grad;
}
