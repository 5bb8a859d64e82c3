/**
 * Softmax and log-softmax over the last axis, and their backward rules. One
 * workgroup per row; the max, the sum of exponentials and the backward dot
 * products are f32 whatever the storage dtype.
 */
import type { DType } from "../dtype.ts";
import { defineKernel } from "../kernel.ts";
import { Tensor } from "../tensor.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./grid.ts";
import { REDUCE_THREADS, WGSL_LOWEST, WGSL_WORKGROUP_REDUCE } from "./wgsl_math.ts";

/** `softmax` or `log_softmax`. */
export type SoftmaxKind = "softmax" | "log_softmax";

const LOOP = `for (var j = lid; j < p.cols; j += ${REDUCE_THREADS}u)`;

/** One workgroup per row: the reduction helpers, the entry point and the row's base index. */
function rowKernel(body: string): string {
  return `${WGSL_WORKGROUP_REDUCE}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  let row = ${WGSL_WORKGROUP_INDEX};
  if (row >= p.rows) { return; }
  let base = row * p.cols;
  ${body}
}`;
}

type Config = { kind: SoftmaxKind; dtype: DType };

export const softmaxForwardKernel = defineKernel({
  name: "softmax_forward",
  bindings: (c: Config) => [
    { name: "x", type: c.dtype },
    { name: "y", type: c.dtype, write: true },
  ],
  uniforms: { rows: "u32", cols: "u32" },
  source: ({ kind, dtype }) =>
    rowKernel(`var m = ${WGSL_LOWEST};
  ${LOOP} { m = max(m, f32(x[base + j])); }
  m = reduce_max(m, lid);
  var s = 0.0;
  ${LOOP} { s += exp(f32(x[base + j]) - m); }
  s = reduce_sum(s, lid);
  ${
      kind === "softmax"
        ? `let inv = 1.0 / s;\n  ${LOOP} { y[base + j] = ${dtype}(exp(f32(x[base + j]) - m) * inv); }`
        : `let shift = m + log(s);\n  ${LOOP} { y[base + j] = ${dtype}(f32(x[base + j]) - shift); }`
    }`),
});

// softmax:     dx = y · (dy − Σ dy·y)
// log-softmax: dx = dy − exp(y) · Σ dy
export const softmaxBackwardKernel = defineKernel({
  name: "softmax_backward",
  bindings: (c: Config) => [
    { name: "y", type: c.dtype },
    { name: "dy", type: c.dtype },
    { name: "dx", type: c.dtype, write: true },
  ],
  uniforms: { rows: "u32", cols: "u32" },
  source: ({ kind, dtype }) =>
    rowKernel(`var d = 0.0;
  ${LOOP} { d += f32(dy[base + j])${kind === "softmax" ? " * f32(y[base + j])" : ""}; }
  d = reduce_sum(d, lid);
  ${LOOP} {
    let yj = f32(y[base + j]);
    let gj = f32(dy[base + j]);
    dx[base + j] = ${dtype}(${kind === "softmax" ? "yj * (gj - d)" : "gj - exp(yj) * d"});
  }`),
});

/** A tensor as rows over its last axis. */
function rowsOf(t: Tensor): { rows: number; cols: number } {
  const cols = t.shape.at(-1) ?? 1;
  return { rows: cols === 0 ? 0 : t.size / cols, cols };
}

/** y = softmax or log-softmax of `x` over its last axis (no autograd). */
export function launchSoftmax(kind: SoftmaxKind, x: Tensor): Tensor {
  const y = Tensor.empty(x.shape, x.dtype, x.gpu);
  const { rows, cols } = rowsOf(x);
  if (rows === 0) return y;
  const kernel = x.gpu.kernel(softmaxForwardKernel, { kind, dtype: x.dtype });
  x.gpu.dispatch(kernel, { x, y }, { rows, cols }, grid1d(rows));
  return y;
}

/** dx from the forward output `y` and upstream `dy` (no autograd). */
export function launchSoftmaxBackward(kind: SoftmaxKind, y: Tensor, dy: Tensor): Tensor {
  const dx = Tensor.empty(y.shape, y.dtype, y.gpu);
  const { rows, cols } = rowsOf(y);
  if (rows === 0) return dx;
  const kernel = y.gpu.kernel(softmaxBackwardKernel, { kind, dtype: y.dtype });
  y.gpu.dispatch(kernel, { y, dy, dx }, { rows, cols }, grid1d(rows));
  return dx;
}
