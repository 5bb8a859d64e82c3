/**
 * A window along one axis, as a copy, and its gradient. Any tensor is seen as
 * [outer, axis·inner]; the window is the columns offset .. offset + width of
 * every row (offset = start·inner, width = length·inner). Forward gathers the
 * window; backward writes the whole wide tensor: the gradient inside the
 * window, zeros outside, in one pass.
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel } from "../device/kernel.ts";
import { DeviceArray } from "../device/device_array.ts";
import { movedType, moveGrid, WGSL_ZERO_SOURCE, wgslMoveMain } from "./wgsl/move_elements.ts";

const UNIFORMS = { n: "u32", wide: "u32", offset: "u32", width: "u32" } as const;

/** narrow[r, c] = x[r, offset + c]. */
export const narrowKernel = defineKernel({
  name: "narrow",
  bindings: (c: { dtype: DType }) => [
    { name: "x", type: movedType(c.dtype) },
    { name: "y", type: movedType(c.dtype), write: true },
  ],
  uniforms: UNIFORMS,
  source: ({ dtype }) =>
    `fn source_index(i: u32) -> u32 { return (i / p.width) * p.wide + p.offset + i % p.width; }
${wgslMoveMain(dtype, "x", "y", "p.n")}`,
});

/** dx[r, c] = g[r, c − offset] inside the window, 0 outside. */
export const narrowBackwardKernel = defineKernel({
  name: "narrow_backward",
  bindings: (c: { dtype: DType }) => [
    { name: "g", type: movedType(c.dtype) },
    { name: "dx", type: movedType(c.dtype), write: true },
  ],
  uniforms: UNIFORMS,
  source: ({ dtype }) =>
    `fn source_index(i: u32) -> u32 {
  let c = i % p.wide;
  if (c < p.offset || c >= p.offset + p.width) { return ${WGSL_ZERO_SOURCE}; }
  return (i / p.wide) * p.width + c - p.offset;
}
${wgslMoveMain(dtype, "g", "dx", "p.n")}`,
});

/** The window of one narrow: x's shape, the axis, and start and length along it. */
export interface NarrowWindow {
  /** Axis (non-negative). */
  axis: number;
  /** First index along the axis. */
  start: number;
  /** How many indices. */
  length: number;
}

function uniformsOf(shape: readonly number[], w: NarrowWindow) {
  const inner = shape.slice(w.axis + 1).reduce((a, b) => a * b, 1);
  return { wide: shape[w.axis] * inner, offset: w.start * inner, width: w.length * inner };
}

/** The window of `x` as a contiguous tensor (no autograd). */
export function launchNarrow(x: DeviceArray, w: NarrowWindow): DeviceArray {
  const shape = x.shape.map((e, a) => (a === w.axis ? w.length : e));
  const y = DeviceArray.empty(shape, x.dtype, x.gpu);
  if (y.size === 0) return y;
  x.gpu.dispatch(
    x.gpu.kernel(narrowKernel, { dtype: x.dtype }),
    { x, y },
    { n: y.size, ...uniformsOf(x.shape, w) },
    moveGrid(x.dtype, y.size),
  );
  return y;
}

/** The gradient of a narrow: `g` placed in its window of a zero tensor of `shape` (no autograd). */
export function launchNarrowBackward(
  g: DeviceArray,
  shape: readonly number[],
  w: NarrowWindow,
): DeviceArray {
  const dx = DeviceArray.empty(shape, g.dtype, g.gpu);
  if (dx.size === 0) return dx;
  g.gpu.dispatch(
    g.gpu.kernel(narrowBackwardKernel, { dtype: g.dtype }),
    { g, dx },
    { n: dx.size, ...uniformsOf(shape, w) },
    moveGrid(g.dtype, dx.size),
  );
  return dx;
}
