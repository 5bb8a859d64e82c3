/**
 * A window along one axis, as a copy, and its gradient. Any tensor is seen as
 * [outer, axis·inner]; the window is the columns offset .. offset + width of
 * every row (offset = start·inner, width = length·inner). Forward gathers the
 * window; backward writes the whole wide tensor: the gradient inside the
 * window, zeros outside, in one pass. `narrow_into` writes a tensor into a
 * window of another in place (a KV cache's next rows, a chunk's rows).
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel } from "../device/kernel.ts";
import { DeviceArray } from "../device/device_array.ts";
import { fail, ShapeError } from "../base/errors.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./wgsl/grid.ts";
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

/** Whether the window's offset and width, and a row of `shape`, are whole bf16 words. */
function fillsWords(shape: readonly number[], w: NarrowWindow): boolean {
  const { wide, offset, width } = uniformsOf(shape, w);
  return wide % 2 === 0 && offset % 2 === 0 && width % 2 === 0;
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

/** dst[r, offset + c] = src[r, c] for the window's columns; the rest of dst is untouched. */
export const narrowIntoKernel = defineKernel({
  name: "narrow_into",
  bindings: (c: { dtype: DType }) => [
    { name: "src", type: movedType(c.dtype) },
    { name: "dst", type: movedType(c.dtype), write: true },
  ],
  uniforms: UNIFORMS,
  // A thread per source element (per source word for bf16, whose windows start and end on
  // whole words: launchNarrowInto checks), so no two threads write one destination word.
  source: () =>
    `@compute @workgroup_size(256)
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${WGSL_WORKGROUP_INDEX} * 256u + lid;
  if (i >= p.n) { return; }
  dst[(i / p.width) * p.wide + p.offset + i % p.width] = src[i];
}`,
});

/**
 * Writes `src` into the window `w` of `dst` in place (no autograd): src's
 * shape is dst's with `w.length` along `w.axis`. For bf16 (two elements a
 * word) the window's offset and width, and dst's row, must be whole words:
 * returns false, writing nothing, where they are not.
 */
export function launchNarrowInto(dst: DeviceArray, src: DeviceArray, w: NarrowWindow): boolean {
  let { wide, offset, width } = uniformsOf(dst.shape, w);
  let n = src.size;
  if (dst.dtype === "bf16") {
    if (!fillsWords(dst.shape, w)) return false;
    [wide, offset, width, n] = [wide / 2, offset / 2, width / 2, n / 2];
  }
  if (n === 0) return true;
  dst.gpu.dispatch(
    dst.gpu.kernel(narrowIntoKernel, { dtype: dst.dtype }),
    { src, dst },
    { n, wide, offset, width },
    grid1d(Math.ceil(n / 256)),
  );
  return true;
}

/**
 * `arrays` joined along `axis` as a new array (they share a dtype and every
 * extent but that axis's): each written into its window with
 * {@link launchNarrowInto}. A bf16 piece that does not start and end on whole
 * words is refused before anything is allocated. No autograd.
 */
export function launchConcat(arrays: readonly DeviceArray[], axis: number): DeviceArray {
  const first = arrays[0];
  const shape = first.shape.map((e, i) =>
    i === axis ? arrays.reduce((n, t) => n + t.shape[axis], 0) : e
  );
  const windows: NarrowWindow[] = [];
  let start = 0;
  for (const t of arrays) {
    windows.push({ axis, start, length: t.shape[axis] });
    start += t.shape[axis];
  }
  if (first.dtype === "bf16") {
    const misfit = windows.findIndex((w) => !fillsWords(shape, w));
    if (misfit >= 0) {
      fail(
        ShapeError,
        "concat",
        `bf16 ${arrays[misfit].describe()} at ${windows[misfit].start} does not fill whole words.`,
      );
    }
  }
  const out = DeviceArray.empty(shape, first.dtype, first.gpu);
  arrays.forEach((t, i) => launchNarrowInto(out, t, windows[i]));
  return out;
}
