/**
 * Reductions along one axis. The input is viewed as [outer, axis, inner] and
 * the output as [outer, inner]. Each output element is a "row" in the sense
 * of row_layout.ts: a workgroup strides over a long axis and combines in
 * workgroup memory, a thread walks a short one alone (adjacent threads then
 * read adjacent elements when inner > 1). Accumulation is f32 always.
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel } from "../device/kernel.ts";
import type { Shape } from "../base/shape.ts";
import { DeviceArray } from "../device/device_array.ts";
import { WGSL_GRID_BUILTINS } from "./wgsl/grid.ts";
import {
  rowGrid,
  type RowLayout,
  rowLayout,
  wgslRowIndex,
  wgslRowLeader,
  wgslRowLoop,
  wgslRowReduce,
} from "./rows/row_layout.ts";
import { REDUCE_THREADS, WGSL_LOWEST } from "./wgsl/math.ts";
import { columnBlocksFor, launchColumnSumInto } from "./rows/reduce_columns.ts";

/** What a reduction computes. `sum` is multiplied by a scale (1/n gives a mean). */
export type ReduceOp = "sum" | "max";

/** The [outer, axis, inner] view of a reduction. */
export interface ReduceView {
  outer: number;
  axis: number;
  inner: number;
}

/**
 * The longest stretch of the axis one output's reduction walks. Longer axes
 * are reduced in two stages: chunks into partial results, then the partials.
 * NOTE: lavapipe stops a shader invocation after 65535 loop iterations in
 * all, silently: a workgroup of 64 over one 5M-long axis summed only its
 * first ~4.2M elements. Chunks also spread one long reduction over many
 * workgroups on a GPU.
 */
export const REDUCE_CHUNK = REDUCE_THREADS * 4096;

export const reduceKernel = defineKernel({
  name: "reduce",
  bindings: (c: { op: ReduceOp; dtype: DType; out: DType; layout: RowLayout }) => [
    { name: "src", type: c.dtype },
    { name: "dst", type: c.out, write: true },
  ],
  uniforms: {
    outputs: "u32",
    axis: "u32",
    inner: "u32",
    chunk: "u32",
    chunks: "u32",
    scale: "f32",
  },
  // Output `row` is (outer index, chunk, inner index); its chunk covers
  // axis positions chunk·p.chunk .. min(+p.chunk, p.axis).
  source: ({ op, layout }) =>
    `${wgslRowReduce(layout)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${wgslRowIndex(layout, "outputs")}
  let within = row / p.inner;
  let first = (within % p.chunks) * p.chunk;
  let count = min(p.chunk, p.axis - first);
  let base = ((within / p.chunks) * p.axis + first) * p.inner + row % p.inner;
  var acc = ${op === "sum" ? "0.0" : WGSL_LOWEST};
  ${wgslRowLoop(layout, "count")} {
    let v = ld_src(base + j * p.inner);
    acc = ${op === "sum" ? "acc + v" : "max_or_nan(acc, v)"};
  }
  let total = reduce_${op}(acc, lid);
  if (${wgslRowLeader(layout)}) { st_dst(row, total${op === "sum" ? " * p.scale" : ""}); }
}`,
});

/**
 * Reduces `src` (viewed as `view`) along the middle axis into a new array of
 * `shape` (outer·inner elements) and dtype `out` (default src's). `scale`
 * multiplies sums. On GPUs a sum over many rows of wide rows runs in two
 * coalesced stages (see rows/reduce_columns.ts). No autograd.
 */
export function launchReduce(
  op: ReduceOp,
  src: DeviceArray,
  view: ReduceView,
  shape: Shape,
  options: { scale?: number; out?: DType } = {},
): DeviceArray {
  const dst = DeviceArray.empty(shape, options.out ?? src.dtype, src.gpu);
  launchReduceInto(op, src, view, dst, options.scale);
  return dst;
}

/**
 * {@link launchReduce} into the caller's `dst` (outer·inner elements, any
 * dtype), overwriting it: the last stage of a split product. No autograd.
 */
export function launchReduceInto(
  op: ReduceOp,
  src: DeviceArray,
  view: ReduceView,
  dst: DeviceArray,
  scale?: number,
): void {
  if (view.outer * view.inner === 0) return;
  if (op === "sum" && columnBlocksFor(src.gpu, view.axis, view.inner)) {
    // Down the rows of [axis, inner] slabs (a bias gradient): two coalesced stages.
    const { outer, axis: rows, inner: cols } = view;
    launchColumnSumInto(src, { outer, rows, cols }, dst, scale);
    return;
  }
  if (view.axis <= REDUCE_CHUNK) {
    reduceChunks(op, src, view, 1, dst, scale);
    return;
  }
  // Two stages: f32 partials per chunk [outer, chunks, inner], then those.
  const chunks = Math.ceil(view.axis / REDUCE_CHUNK);
  const partials = DeviceArray.empty([view.outer * chunks * view.inner], "f32", src.gpu);
  reduceChunks(op, src, view, chunks, partials);
  reduceChunks(op, partials, { ...view, axis: chunks }, 1, dst, scale);
  partials.dispose();
}

/** One dispatch into `dst`: each output reduces one chunk of the axis (all of it when `chunks` is 1). */
function reduceChunks(
  op: ReduceOp,
  src: DeviceArray,
  view: ReduceView,
  chunks: number,
  dst: DeviceArray,
  scale = 1,
): DeviceArray {
  const chunk = Math.ceil(view.axis / chunks), outputs = view.outer * chunks * view.inner;
  const layout = rowLayout(src.gpu, chunk);
  const kernel = src.gpu.kernel(reduceKernel, { op, dtype: src.dtype, out: dst.dtype, layout });
  src.gpu.dispatch(
    kernel,
    { src, dst },
    { outputs, axis: view.axis, inner: view.inner, chunk, chunks, scale },
    rowGrid(layout, outputs),
  );
  return dst;
}
