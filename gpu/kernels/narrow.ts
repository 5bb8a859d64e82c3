/**
 * A window along one axis, as a copy, and its gradient. Any tensor is seen as
 * [outer, axis·inner]; the window is the columns offset .. offset + width of
 * every row (offset = start·inner, width = length·inner). Forward gathers the
 * window; backward writes the whole wide tensor: the gradient inside the
 * window, zeros outside, in one pass.
 */
import type { DType } from "../dtype.ts";
import { defineKernel } from "../kernel.ts";
import { Tensor } from "../tensor.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./grid.ts";

const WORKGROUP = 256;

const UNIFORMS = { n: "u32", wide: "u32", offset: "u32", width: "u32" } as const;

const INDEX = `let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  if (i >= p.n) { return; }`;

/** narrow[r, c] = x[r, offset + c]. */
export const narrowKernel = defineKernel({
  name: "narrow",
  bindings: (c: { dtype: DType }) => [
    { name: "x", type: c.dtype },
    { name: "y", type: c.dtype, write: true },
  ],
  uniforms: UNIFORMS,
  source: () =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${INDEX}
  y[i] = x[(i / p.width) * p.wide + p.offset + i % p.width];
}`,
});

/** dx[r, c] = g[r, c − offset] inside the window, 0 outside. */
export const narrowBackwardKernel = defineKernel({
  name: "narrow_backward",
  bindings: (c: { dtype: DType }) => [
    { name: "g", type: c.dtype },
    { name: "dx", type: c.dtype, write: true },
  ],
  uniforms: UNIFORMS,
  source: ({ dtype }) =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${INDEX}
  let c = i % p.wide;
  var value = ${dtype}(0);
  if (c >= p.offset && c < p.offset + p.width) { value = g[(i / p.wide) * p.width + c - p.offset]; }
  dx[i] = value;
}`,
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
export function launchNarrow(x: Tensor, w: NarrowWindow): Tensor {
  const shape = x.shape.map((e, a) => (a === w.axis ? w.length : e));
  const y = Tensor.empty(shape, x.dtype, x.gpu);
  if (y.size === 0) return y;
  x.gpu.dispatch(
    x.gpu.kernel(narrowKernel, { dtype: x.dtype }),
    { x, y },
    { n: y.size, ...uniformsOf(x.shape, w) },
    grid1d(Math.ceil(y.size / WORKGROUP)),
  );
  return y;
}

/** The gradient of a narrow: `g` placed in its window of a zero tensor of `shape` (no autograd). */
export function launchNarrowBackward(g: Tensor, shape: readonly number[], w: NarrowWindow): Tensor {
  const dx = Tensor.empty(shape, g.dtype, g.gpu);
  if (dx.size === 0) return dx;
  g.gpu.dispatch(
    g.gpu.kernel(narrowBackwardKernel, { dtype: g.dtype }),
    { g, dx },
    { n: dx.size, ...uniformsOf(shape, w) },
    grid1d(Math.ceil(dx.size / WORKGROUP)),
  );
  return dx;
}
