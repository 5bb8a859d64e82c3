/**
 * Causal (lower-triangular) softmax over the last axis of scores shaped
 * [..., T, T], and its backward rule. Row i of each T×T matrix reads only
 * columns j ≤ i; the masked entries (j > i) get probability 0 and gradient 0
 * and are never read, so they may hold anything. An optional scale s is fused
 * in (softmax(s·x), as attention's 1/√d), saving a pass over the scores.
 *
 * Short rows run one per thread, long rows one per workgroup (as the plain
 * softmax does); either way the max, the sum of exponentials and the backward
 * dot product are f32 whatever the storage dtype. Elements are read and
 * written through the `ld_`/`st_` accessors, so one source serves f32, f16
 * and bf16 (whose rows of odd length share words with their neighbours: the
 * single-element stores never clobber the other half).
 */
import type { DType } from "../../base/dtype.ts";
import { defineKernel } from "../../device/kernel.ts";
import { DeviceArray } from "../../device/device_array.ts";
import { WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "../wgsl/grid.ts";
import { rowGrid, type RowLayout, rowLayout, wgslRowReduce } from "./row_layout.ts";
import { REDUCE_THREADS, WGSL_LOWEST } from "../wgsl/math.ts";

// `valid` columns (0..=i) are visible to row i; the rest of the row is masked.
const VISIBLE = `for (var j = lid; j < valid; j += ${REDUCE_THREADS}u)`;
const ALL = `for (var j = lid; j < p.cols; j += ${REDUCE_THREADS}u)`;
const ROW = `let row = ${WGSL_WORKGROUP_INDEX};
  if (row >= p.rows) { return; }
  let base = row * p.cols;
  let valid = row % p.cols + 1u;
  let s = p.scale;`;

const THREAD_ROW = `let row = ${WGSL_WORKGROUP_INDEX} * ${REDUCE_THREADS}u + lid;
  if (row >= p.rows) { return; }
  let base = row * p.cols;
  let valid = row % p.cols + 1u;
  let s = p.scale;`;

function forwardBody(layout: RowLayout): string {
  if (layout === "thread") {
    return `${THREAD_ROW}
  var m = ${WGSL_LOWEST};
  for (var j = 0u; j < valid; j++) { m = max(m, s * ld_x(base + j)); }
  var total = 0.0;
  for (var j = 0u; j < valid; j++) { total += exp(s * ld_x(base + j) - m); }
  let inv = 1.0 / total;
  for (var j = 0u; j < valid; j++) { st_y(base + j, exp(s * ld_x(base + j) - m) * inv); }
  for (var j = valid; j < p.cols; j++) { st_y(base + j, 0.0); }`;
  }
  return `${ROW}
  var m = ${WGSL_LOWEST};
  ${VISIBLE} { m = max(m, s * ld_x(base + j)); }
  m = reduce_max(m, lid);
  var total = 0.0;
  ${VISIBLE} { total += exp(s * ld_x(base + j) - m); }
  total = reduce_sum(total, lid);
  let inv = 1.0 / total;
  ${ALL} {
    var v = 0.0;
    if (j < valid) { v = exp(s * ld_x(base + j) - m) * inv; }
    st_y(base + j, v);
  }`;
}

function backwardBody(layout: RowLayout): string {
  if (layout === "thread") {
    return `${THREAD_ROW}
  var d = 0.0;
  for (var j = 0u; j < valid; j++) { d += ld_dy(base + j) * ld_y(base + j); }
  for (var j = 0u; j < valid; j++) {
    st_dx(base + j, s * ld_y(base + j) * (ld_dy(base + j) - d));
  }
  for (var j = valid; j < p.cols; j++) { st_dx(base + j, 0.0); }`;
  }
  return `${ROW}
  var d = 0.0;
  ${VISIBLE} { d += ld_dy(base + j) * ld_y(base + j); }
  d = reduce_sum(d, lid);
  ${ALL} {
    var v = 0.0;
    if (j < valid) { v = s * ld_y(base + j) * (ld_dy(base + j) - d); }
    st_dx(base + j, v);
  }`;
}

type Config = { dtype: DType; layout: RowLayout };

/** y = causal softmax of s·x, row by row. */
export const causalSoftmaxForwardKernel = defineKernel({
  name: "causal_softmax_forward",
  bindings: (c: Config) => [
    { name: "x", type: c.dtype },
    { name: "y", type: c.dtype, write: true },
  ],
  uniforms: { rows: "u32", cols: "u32", scale: "f32" },
  source: ({ layout }) =>
    `${layout === "thread" ? "" : wgslRowReduce(layout)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${forwardBody(layout)}
}`,
});

/** dx = s · y · (dy − Σ_{j ≤ i} dy·y) on visible entries, 0 on masked ones. */
export const causalSoftmaxBackwardKernel = defineKernel({
  name: "causal_softmax_backward",
  bindings: (c: Config) => [
    { name: "y", type: c.dtype },
    { name: "dy", type: c.dtype },
    { name: "dx", type: c.dtype, write: true },
  ],
  uniforms: { rows: "u32", cols: "u32", scale: "f32" },
  source: ({ layout }) =>
    `${layout === "thread" ? "" : wgslRowReduce(layout)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${backwardBody(layout)}
}`,
});

/** Rows (every row of every T×T matrix), T, the layout and the dispatch grid. */
function rowsOf(t: DeviceArray) {
  const cols = t.shape.at(-1) ?? 1;
  const rows = cols === 0 ? 0 : t.size / cols;
  const layout = rowLayout(t.gpu, cols);
  const grid = rowGrid(layout, rows);
  return { rows, cols, config: { dtype: t.dtype, layout }, grid };
}

/** y = causal softmax of `scale`·x over the last axis (no autograd). */
export function launchCausalSoftmax(x: DeviceArray, scale: number): DeviceArray {
  const y = DeviceArray.empty(x.shape, x.dtype, x.gpu);
  const { rows, cols, config, grid } = rowsOf(x);
  if (rows === 0) return y;
  const kernel = x.gpu.kernel(causalSoftmaxForwardKernel, config);
  x.gpu.dispatch(kernel, { x, y }, { rows, cols, scale }, grid);
  return y;
}

/** dx from the forward output `y` and upstream `dy` (no autograd). */
export function launchCausalSoftmaxBackward(
  y: DeviceArray,
  dy: DeviceArray,
  scale: number,
): DeviceArray {
  const dx = DeviceArray.empty(y.shape, y.dtype, y.gpu);
  const { rows, cols, config, grid } = rowsOf(y);
  if (rows === 0) return dx;
  const kernel = y.gpu.kernel(causalSoftmaxBackwardKernel, config);
  y.gpu.dispatch(kernel, { y, dy, dx }, { rows, cols, scale }, grid);
  return dx;
}
