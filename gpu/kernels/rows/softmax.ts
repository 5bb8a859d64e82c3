/**
 * Softmax and log-softmax over the last axis, and their backward rules. A
 * thread per short row, or several threads per row and several rows per
 * workgroup (see row_layout.ts), vec4 loads where the row length is a
 * multiple of 4 (row_width.ts); the max, the sum of exponentials and the
 * backward dot products are f32 whatever the storage dtype (f32, f16, bf16).
 */
import type { DType } from "../../base/dtype.ts";
import { defineKernel } from "../../device/kernel.ts";
import { DeviceArray } from "../../device/device_array.ts";
import { WGSL_GRID_BUILTINS } from "../wgsl/grid.ts";
import {
  rowGrid,
  type RowLayout,
  rowPlan,
  wgslRowIndex,
  wgslRowLoop,
  wgslRowReduce,
} from "./row_layout.ts";
import { ld, rowElement, type RowWidth, wgslRowStores, wgslRowWidth } from "./row_width.ts";
import { REDUCE_THREADS, WGSL_LOWEST } from "../wgsl/math.ts";

/** `softmax` or `log_softmax`. */
export type SoftmaxKind = "softmax" | "log_softmax";

type Config = {
  kind: SoftmaxKind;
  dtype: DType;
  layout: RowLayout;
  lanes: number;
  width: RowWidth;
};

/** A row kernel: the helpers, the entry point and the row's `base` unit and length `n` (in units) around `body`. */
function rowKernel(c: Config, body: string): string {
  return `${wgslRowReduce(c.layout, c.lanes)}${wgslRowWidth(c.width)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${wgslRowIndex(c.layout, "rows", c.lanes)}
  let n = p.cols / ${c.width}u;
  let base = row * n;
  ${body}
}`;
}

export const softmaxForwardKernel = defineKernel({
  name: "softmax_forward",
  bindings: (c: Config) => [
    { name: "x", type: rowElement(c.dtype, c.width) },
    { name: "y", type: rowElement(c.dtype, c.width), write: true },
  ],
  uniforms: { rows: "u32", cols: "u32" },
  source: (c) => {
    const loop = wgslRowLoop(c.layout, "n", c.lanes);
    const x = ld(c.width, "x", "base + j");
    const out = c.kind === "softmax"
      ? `let inv = 1.0 / s;\n  ${
        wgslRowStores(c, loop, { name: "y", body: "", value: `exp(${x} - m) * inv` })
      }`
      // (x − m) − log s, not x − (m + log s): at |m| ≫ 1 the sum m + log s rounds log s away.
      : `let ls = log(s);\n  ${
        wgslRowStores(c, loop, { name: "y", body: "", value: `(${x} - m) - ls` })
      }`;
    return rowKernel(
      c,
      `var mv = V(${WGSL_LOWEST});
  ${loop} { mv = max(mv, ${x}); }
  let m = reduce_max(hmax(mv), lid);
  var sv = V(0.0);
  ${loop} { sv += exp(${x} - m); }
  let s = reduce_sum(hsum(sv), lid);
  ${out}`,
    );
  },
});

// softmax:     dx = y · (dy − Σ dy·y)
// log-softmax: dx = dy − exp(y) · Σ dy
export const softmaxBackwardKernel = defineKernel({
  name: "softmax_backward",
  bindings: (c: Config) => [
    { name: "y", type: rowElement(c.dtype, c.width) },
    { name: "dy", type: rowElement(c.dtype, c.width) },
    { name: "dx", type: rowElement(c.dtype, c.width), write: true },
  ],
  uniforms: { rows: "u32", cols: "u32" },
  source: (c) => {
    const loop = wgslRowLoop(c.layout, "n", c.lanes);
    const y = ld(c.width, "y", "base + j"), dy = ld(c.width, "dy", "base + j");
    const dx = c.kind === "softmax" ? "yj * (gj - d)" : "gj - exp(yj) * d";
    return rowKernel(
      c,
      `var dv = V(0.0);
  ${loop} { dv += ${dy}${c.kind === "softmax" ? ` * ${y}` : ""}; }
  let d = reduce_sum(hsum(dv), lid);
  ${wgslRowStores(c, loop, { name: "dx", body: `let yj = ${y}; let gj = ${dy};`, value: dx })}`,
    );
  },
});

/** A tensor as rows over its last axis. */
function rowsOf(t: DeviceArray): { rows: number; cols: number } {
  const cols = t.shape.at(-1) ?? 1;
  return { rows: cols === 0 ? 0 : t.size / cols, cols };
}

/** y = softmax or log-softmax of `x` over its last axis (no autograd). */
export function launchSoftmax(kind: SoftmaxKind, x: DeviceArray): DeviceArray {
  const y = DeviceArray.empty(x.shape, x.dtype, x.gpu);
  const { rows, cols } = rowsOf(x);
  if (rows === 0) return y;
  const plan = rowPlan(x.gpu, cols);
  const kernel = x.gpu.kernel(softmaxForwardKernel, { kind, dtype: x.dtype, ...plan });
  x.gpu.dispatch(kernel, { x, y }, { rows, cols }, rowGrid(plan, rows));
  return y;
}

/** dx from the forward output `y` and upstream `dy` (no autograd). */
export function launchSoftmaxBackward(
  kind: SoftmaxKind,
  y: DeviceArray,
  dy: DeviceArray,
): DeviceArray {
  const dx = DeviceArray.empty(y.shape, y.dtype, y.gpu);
  const { rows, cols } = rowsOf(y);
  if (rows === 0) return dx;
  const plan = rowPlan(y.gpu, cols);
  const kernel = y.gpu.kernel(softmaxBackwardKernel, { kind, dtype: y.dtype, ...plan });
  y.gpu.dispatch(kernel, { y, dy, dx }, { rows, cols }, rowGrid(plan, rows));
  return dx;
}
