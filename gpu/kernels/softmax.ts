/**
 * Softmax and log-softmax over the last axis, and their backward rules. A
 * workgroup per row, or a thread per short row (see row_layout.ts); the max,
 * the sum of exponentials and the backward dot products are f32 whatever the
 * storage dtype.
 */
import type { DType } from "../dtype.ts";
import { defineKernel } from "../kernel.ts";
import { Tensor } from "../tensor.ts";
import { WGSL_GRID_BUILTINS } from "./grid.ts";
import {
  rowGrid,
  type RowLayout,
  rowLayout,
  wgslRowIndex,
  wgslRowLoop,
  wgslRowReduce,
} from "./row_layout.ts";
import { REDUCE_THREADS, WGSL_LOWEST } from "./wgsl_math.ts";

/** `softmax` or `log_softmax`. */
export type SoftmaxKind = "softmax" | "log_softmax";

/** A row kernel: the reduction helpers, the entry point and the row's base index around `body`. */
function rowKernel(layout: RowLayout, body: string): string {
  return `${wgslRowReduce(layout)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${wgslRowIndex(layout, "rows")}
  let base = row * p.cols;
  ${body}
}`;
}

type Config = { kind: SoftmaxKind; dtype: DType; layout: RowLayout };

export const softmaxForwardKernel = defineKernel({
  name: "softmax_forward",
  bindings: (c: Config) => [
    { name: "x", type: c.dtype },
    { name: "y", type: c.dtype, write: true },
  ],
  uniforms: { rows: "u32", cols: "u32" },
  source: ({ kind, dtype, layout }) => {
    const loop = wgslRowLoop(layout, "p.cols");
    return rowKernel(
      layout,
      `var m = ${WGSL_LOWEST};
  ${loop} { m = max(m, f32(x[base + j])); }
  m = reduce_max(m, lid);
  var s = 0.0;
  ${loop} { s += exp(f32(x[base + j]) - m); }
  s = reduce_sum(s, lid);
  ${
        kind === "softmax"
          ? `let inv = 1.0 / s;\n  ${loop} { y[base + j] = ${dtype}(exp(f32(x[base + j]) - m) * inv); }`
          : `let shift = m + log(s);\n  ${loop} { y[base + j] = ${dtype}(f32(x[base + j]) - shift); }`
      }`,
    );
  },
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
  source: ({ kind, dtype, layout }) => {
    const loop = wgslRowLoop(layout, "p.cols");
    return rowKernel(
      layout,
      `var d = 0.0;
  ${loop} { d += f32(dy[base + j])${kind === "softmax" ? " * f32(y[base + j])" : ""}; }
  d = reduce_sum(d, lid);
  ${loop} {
    let yj = f32(y[base + j]);
    let gj = f32(dy[base + j]);
    dx[base + j] = ${dtype}(${kind === "softmax" ? "yj * (gj - d)" : "gj - exp(yj) * d"});
  }`,
    );
  },
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
  const layout = rowLayout(x.gpu, cols);
  const kernel = x.gpu.kernel(softmaxForwardKernel, { kind, dtype: x.dtype, layout });
  x.gpu.dispatch(kernel, { x, y }, { rows, cols }, rowGrid(layout, rows));
  return y;
}

/** dx from the forward output `y` and upstream `dy` (no autograd). */
export function launchSoftmaxBackward(kind: SoftmaxKind, y: Tensor, dy: Tensor): Tensor {
  const dx = Tensor.empty(y.shape, y.dtype, y.gpu);
  const { rows, cols } = rowsOf(y);
  if (rows === 0) return dx;
  const layout = rowLayout(y.gpu, cols);
  const kernel = y.gpu.kernel(softmaxBackwardKernel, { kind, dtype: y.dtype, layout });
  y.gpu.dispatch(kernel, { y, dy, dx }, { rows, cols }, rowGrid(layout, rows));
  return dx;
}
