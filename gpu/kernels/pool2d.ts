/**
 * 2-D pooling over the last two axes of a contiguous [planes, H, W] view
 * (NCHW: planes = N·C), one thread per output element forward and one per
 * input element backward. Sums and comparisons run in f32; x, y, the
 * gradients and dx are stored in the input's dtype (f32, f16 or bf16, read
 * and written through the `ld_`/`st_` accessors of gpu/device/kernel.ts).
 *
 * Backward is a gather, never a scatter: each input element walks the few
 * output windows that can contain it (at most kh·kw of them; for adaptive
 * pooling, the ones whose [start, end) ranges cover it) and adds their
 * contributions in f32. Overlapping windows (stride < kernel) therefore sum
 * without atomics, and the result does not depend on thread scheduling.
 *
 * Max pooling saves, per output element, the flat index (row · W + col) of
 * the chosen element within its input plane as i32, or −1 for a window that
 * holds padding only (possible with dilation); the backward compares it with
 * each candidate input element. The choice follows PyTorch: the first
 * maximum in row-major window order, except that a NaN wins over everything
 * and a later NaN over an earlier one (`val > max || isnan(val)`).
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel, optional } from "../device/kernel.ts";
import type { Shape } from "../base/shape.ts";
import { DeviceArray } from "../device/device_array.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./wgsl/grid.ts";
import { wgslIsNan } from "./wgsl/math.ts";

const WORKGROUP = 256;

/** Where one pooling call reads and writes: sizes of the [planes, H, W] view and its windows. */
export interface Pool2dGeometry {
  /** The input's shape ([N, C, H, W] or [C, H, W]). */
  readonly inputShape: Shape;
  /** The output's shape (same rank, last two axes [oh, ow]). */
  readonly outputShape: Shape;
  /** N·C (or C): the number of independent planes. */
  readonly planes: number;
  /** Input height. */
  readonly h: number;
  /** Input width. */
  readonly w: number;
  /** Output height. */
  readonly oh: number;
  /** Output width. */
  readonly ow: number;
  /** Window [height, width] (unused by adaptive pooling). */
  readonly kernel: readonly [number, number];
  /** Step between windows [y, x] (unused by adaptive pooling). */
  readonly stride: readonly [number, number];
  /** Implicit padding on each side [y, x] (unused by adaptive pooling). */
  readonly padding: readonly [number, number];
  /** Spacing of window taps [y, x] (1 for average pooling). */
  readonly dilation: readonly [number, number];
}

/** The window uniforms every fixed-window kernel declares. */
const WINDOW_UNIFORMS = {
  total: "u32",
  h: "u32",
  w: "u32",
  oh: "u32",
  ow: "u32",
  kh: "u32",
  kw: "u32",
  sh: "u32",
  sw: "u32",
  ph: "u32",
  pw: "u32",
  dh: "u32",
  dw: "u32",
} as const;

function windowUniforms(geo: Pool2dGeometry, total: number) {
  return {
    total,
    h: geo.h,
    w: geo.w,
    oh: geo.oh,
    ow: geo.ow,
    kh: geo.kernel[0],
    kw: geo.kernel[1],
    sh: geo.stride[0],
    sw: geo.stride[1],
    ph: geo.padding[0],
    pw: geo.padding[1],
    dh: geo.dilation[0],
    dw: geo.dilation[1],
  };
}

/** The thread's element index `i`, returning when it is past `p.total`. */
const THREAD_INDEX = `let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  if (i >= p.total) { return; }`;

/** Output coordinates (oy, ox) of thread `i`, its plane and the plane's input offset `base`. */
const OUTPUT_COORDS = `let ox = i % p.ow;
  let oy = (i / p.ow) % p.oh;
  let base = (i / (p.ow * p.oh)) * p.h * p.w;
  let y0 = i32(oy * p.sh) - i32(p.ph);
  let x0 = i32(ox * p.sw) - i32(p.pw);`;

/** Input coordinates (iy, ix) of thread `i` and the plane's output offset `obase`. */
const INPUT_COORDS = `let ix = i % p.w;
  let iy = (i / p.w) % p.h;
  let obase = (i / (p.w * p.h)) * p.oh * p.ow;`;

/**
 * Loops over the output windows of a fixed-window pool that hold input
 * (iy, ix) through tap (ky, kx), binding `oy`, `ox` and the output index `o`.
 * A tap reaches at most one window, so no window is visited twice. With
 * `disjoint` windows (stride ≥ kernel, no dilation: the usual MaxPool2d(2))
 * an input lies in at most one window, found by one division per axis
 * instead of a loop over the taps.
 */
function forEachWindow(body: string, disjoint: boolean): string {
  if (disjoint) {
    return `{
    let oy = (iy + p.ph) / p.sh;
    let ox = (ix + p.pw) / p.sw;
    if (iy + p.ph - oy * p.sh < p.kh && ix + p.pw - ox * p.sw < p.kw && oy < p.oh && ox < p.ow) {
      let o = obase + oy * p.ow + ox;
      ${body}
    }
  }`;
  }
  return `for (var ky = 0u; ky < p.kh; ky++) {
    let ty = i32(iy + p.ph) - i32(ky * p.dh);
    if (ty < 0 || u32(ty) % p.sh != 0u) { continue; }
    let oy = u32(ty) / p.sh;
    if (oy >= p.oh) { continue; }
    for (var kx = 0u; kx < p.kw; kx++) {
      let tx = i32(ix + p.pw) - i32(kx * p.dw);
      if (tx < 0 || u32(tx) % p.sw != 0u) { continue; }
      let ox = u32(tx) / p.sw;
      if (ox >= p.ow) { continue; }
      let o = obase + oy * p.ow + ox;
      ${body}
    }
  }`;
}

/** Max pooling forward: y, and the argmax per output when `indices` is set. */
export const maxPool2dKernel = defineKernel({
  name: "max_pool2d",
  bindings: (c: { dtype: DType; indices: boolean }) => [
    { name: "x", type: c.dtype },
    { name: "y", type: c.dtype, write: true },
    ...optional(c.indices, { name: "idx", type: "i32", write: true }),
  ],
  uniforms: { ...WINDOW_UNIFORMS, neg_inf: "f32" },
  source: ({ indices }) =>
    `fn is_nan(v: f32) -> bool {
  return ${wgslIsNan("v")};
}

@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD_INDEX}
  ${OUTPUT_COORDS}
  var best = 0.0;
  var arg = -1;
  var nan_seen = false;
  for (var ky = 0u; ky < p.kh; ky++) {
    let iy = y0 + i32(ky * p.dh);
    if (iy < 0 || iy >= i32(p.h)) { continue; }
    for (var kx = 0u; kx < p.kw; kx++) {
      let ix = x0 + i32(kx * p.dw);
      if (ix < 0 || ix >= i32(p.w)) { continue; }
      let pos = iy * i32(p.w) + ix;
      let v = ld_x(base + u32(pos));
      let v_nan = is_nan(v);
      if (v_nan || (!nan_seen && (arg < 0 || v > best))) {
        best = v;
        arg = pos;
        nan_seen = nan_seen || v_nan;
      }
    }
  }
  // The chosen element itself, widened and stored back: exact in every dtype
  // (a bf16 NaN becomes the quiet 0x7FC0, as every conversion to bf16 does).
  if (arg >= 0) { st_y(i, ld_x(base + u32(arg))); } else { st_y(i, p.neg_inf); }
  ${indices ? "idx[i] = arg;" : ""}
}`,
});

/** Max pooling backward: dx[i] = Σ g[o] over the windows o whose saved argmax is i. */
export const maxPool2dBackwardKernel = defineKernel({
  name: "max_pool2d_backward",
  bindings: (c: { dtype: DType; disjoint: boolean }) => [
    { name: "g", type: c.dtype },
    { name: "idx", type: "i32" },
    { name: "dx", type: c.dtype, write: true },
  ],
  uniforms: WINDOW_UNIFORMS,
  source: ({ disjoint }) =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD_INDEX}
  ${INPUT_COORDS}
  let here = i32(iy * p.w + ix);
  var acc = 0.0;
  ${forEachWindow("if (idx[o] == here) { acc += ld_g(o); }", disjoint)}
  st_dx(i, acc);
}`,
});

/** The f32 sum of x over rows [ya, yb) and columns [xa, xb) of the plane at `base`. */
const WGSL_WINDOW_SUM = `fn window_sum(base: u32, ya: u32, yb: u32, xa: u32, xb: u32) -> f32 {
  var acc = 0.0;
  for (var iy = ya; iy < yb; iy++) {
    for (var ix = xa; ix < xb; ix++) { acc += ld_x(base + iy * p.w + ix); }
  }
  return acc;
}
`;

/**
 * The divisor of average-pooling window (oy, ox), as PyTorch's avg_pool2d:
 * `divisor_override` when nonzero; else with `include_pad` the window's area
 * clipped to input + padding (kh·kw unless a ceil-mode window overhangs);
 * else the number of input elements it holds.
 */
const WGSL_AVG_DIVISOR = `fn divisor(oy: u32, ox: u32) -> f32 {
  if (p.divisor_override != 0) { return f32(p.divisor_override); }
  let y0 = i32(oy * p.sh) - i32(p.ph);
  let x0 = i32(ox * p.sw) - i32(p.pw);
  if (p.include_pad == 1u) {
    let rows = min(y0 + i32(p.kh), i32(p.h + p.ph)) - y0;
    let cols = min(x0 + i32(p.kw), i32(p.w + p.pw)) - x0;
    return f32(rows * cols);
  }
  let rows = min(y0 + i32(p.kh), i32(p.h)) - max(y0, 0);
  let cols = min(x0 + i32(p.kw), i32(p.w)) - max(x0, 0);
  return f32(rows * cols);
}
`;

const AVG_UNIFORMS = { ...WINDOW_UNIFORMS, include_pad: "u32", divisor_override: "i32" } as const;

/** Average pooling forward: each window's f32 sum over its divisor. */
export const avgPool2dKernel = defineKernel({
  name: "avg_pool2d",
  bindings: (c: { dtype: DType }) => [
    { name: "x", type: c.dtype },
    { name: "y", type: c.dtype, write: true },
  ],
  uniforms: AVG_UNIFORMS,
  source: () =>
    `${WGSL_WINDOW_SUM}${WGSL_AVG_DIVISOR}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD_INDEX}
  ${OUTPUT_COORDS}
  let ya = u32(max(y0, 0));
  let yb = u32(min(y0 + i32(p.kh), i32(p.h)));
  let xa = u32(max(x0, 0));
  let xb = u32(min(x0 + i32(p.kw), i32(p.w)));
  st_y(i, window_sum(base, ya, yb, xa, xb) / divisor(oy, ox));
}`,
});

/** Average pooling backward: dx[i] = Σ g[o] / divisor(o) over the windows o holding i. */
export const avgPool2dBackwardKernel = defineKernel({
  name: "avg_pool2d_backward",
  bindings: (c: { dtype: DType; disjoint: boolean }) => [
    { name: "g", type: c.dtype },
    { name: "dx", type: c.dtype, write: true },
  ],
  uniforms: AVG_UNIFORMS,
  source: ({ disjoint }) =>
    `${WGSL_AVG_DIVISOR}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD_INDEX}
  ${INPUT_COORDS}
  var acc = 0.0;
  ${forEachWindow("acc += ld_g(o) / divisor(oy, ox);", disjoint)}
  st_dx(i, acc);
}`,
});

/** PyTorch's adaptive window of output `o` of `n` over `size`: [⌊o·size/n⌋, ⌈(o+1)·size/n⌉). */
const WGSL_ADAPTIVE = `fn win_start(o: u32, n: u32, size: u32) -> u32 { return (o * size) / n; }
fn win_end(o: u32, n: u32, size: u32) -> u32 { return ((o + 1u) * size + n - 1u) / n; }
`;

const ADAPTIVE_UNIFORMS = { total: "u32", h: "u32", w: "u32", oh: "u32", ow: "u32" } as const;

/** Adaptive average pooling forward: the mean of each output's adaptive window. */
export const adaptiveAvgPool2dKernel = defineKernel({
  name: "adaptive_avg_pool2d",
  bindings: (c: { dtype: DType }) => [
    { name: "x", type: c.dtype },
    { name: "y", type: c.dtype, write: true },
  ],
  uniforms: ADAPTIVE_UNIFORMS,
  source: () =>
    `${WGSL_ADAPTIVE}${WGSL_WINDOW_SUM}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD_INDEX}
  let ox = i % p.ow;
  let oy = (i / p.ow) % p.oh;
  let base = (i / (p.ow * p.oh)) * p.h * p.w;
  let ya = win_start(oy, p.oh, p.h);
  let yb = win_end(oy, p.oh, p.h);
  let xa = win_start(ox, p.ow, p.w);
  let xb = win_end(ox, p.ow, p.w);
  let acc = window_sum(base, ya, yb, xa, xb);
  st_y(i, acc / f32((yb - ya) * (xb - xa)));
}`,
});

/**
 * Adaptive average pooling backward. Input row iy lies in the windows of
 * output rows ⌊iy·oh/H⌋ … ⌈(iy+1)·oh/H⌉ − 1 (and likewise for columns);
 * each is checked against its window, then adds g / window size.
 */
export const adaptiveAvgPool2dBackwardKernel = defineKernel({
  name: "adaptive_avg_pool2d_backward",
  bindings: (c: { dtype: DType }) => [
    { name: "g", type: c.dtype },
    { name: "dx", type: c.dtype, write: true },
  ],
  uniforms: ADAPTIVE_UNIFORMS,
  source: () =>
    `${WGSL_ADAPTIVE}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${THREAD_INDEX}
  ${INPUT_COORDS}
  let oy_end = min(((iy + 1u) * p.oh + p.h - 1u) / p.h, p.oh);
  let ox_end = min(((ix + 1u) * p.ow + p.w - 1u) / p.w, p.ow);
  var acc = 0.0;
  for (var oy = (iy * p.oh) / p.h; oy < oy_end; oy++) {
    let ya = win_start(oy, p.oh, p.h);
    let yb = win_end(oy, p.oh, p.h);
    if (iy < ya || iy >= yb) { continue; }
    for (var ox = (ix * p.ow) / p.w; ox < ox_end; ox++) {
      let xa = win_start(ox, p.ow, p.w);
      let xb = win_end(ox, p.ow, p.w);
      if (ix < xa || ix >= xb) { continue; }
      acc += ld_g(obase + oy * p.ow + ox) / f32((yb - ya) * (xb - xa));
    }
  }
  st_dx(i, acc);
}`,
});

function groups(n: number): [number, number] {
  return grid1d(Math.ceil(n / WORKGROUP));
}

/**
 * A new tensor of `shape` (`like`'s dtype and device) filled by `dispatch`,
 * one thread per element; nothing runs when it is empty.
 */
function perElement(
  like: DeviceArray,
  shape: Shape,
  dispatch: (out: DeviceArray, total: number) => void,
): DeviceArray {
  const out = DeviceArray.empty(shape, like.dtype, like.gpu);
  if (out.size > 0) dispatch(out, out.size);
  return out;
}

/**
 * Max pooling of `x` over `geo` (no autograd): y in x's dtype, and with
 * `withIndices` the i32 argmax per output element (see the module docs).
 */
export function launchMaxPool2d(
  x: DeviceArray,
  geo: Pool2dGeometry,
  withIndices: boolean,
): { y: DeviceArray; indices: DeviceArray | null } {
  const y = DeviceArray.empty(geo.outputShape, x.dtype, x.gpu);
  const indices = withIndices ? DeviceArray.empty(geo.outputShape, "i32", x.gpu) : null;
  const total = y.size;
  if (total === 0) return { y, indices };
  const kernel = x.gpu.kernel(maxPool2dKernel, { dtype: x.dtype, indices: withIndices });
  x.gpu.dispatch(
    kernel,
    indices ? { x, y, idx: indices } : { x, y },
    { ...windowUniforms(geo, total), neg_inf: -Infinity },
    groups(total),
  );
  return { y, indices };
}

/** The input gradient of max pooling from `g` and the saved argmax `indices` (no autograd). */
export function launchMaxPool2dBackward(
  g: DeviceArray,
  indices: DeviceArray,
  geo: Pool2dGeometry,
): DeviceArray {
  const kernel = g.gpu.kernel(maxPool2dBackwardKernel, {
    dtype: g.dtype,
    disjoint: isDisjoint(geo),
  });
  return perElement(g, geo.inputShape, (dx, total) =>
    g.gpu.dispatch(
      kernel,
      { g, idx: indices, dx },
      windowUniforms(geo, total),
      groups(total),
    ));
}

/** Whether no two windows share an input element (and each is contiguous). */
function isDisjoint(geo: Pool2dGeometry): boolean {
  const [kh, kw] = geo.kernel, [sh, sw] = geo.stride, [dh, dw] = geo.dilation;
  return dh === 1 && dw === 1 && sh >= kh && sw >= kw;
}

/** How average pooling divides (the options of `avgPool2d` of the same names). */
export interface AvgDivisor {
  /** Whether padding counts in the divisor. */
  readonly countIncludePad: boolean;
  /** The divisor of every window, or null. */
  readonly divisorOverride: number | null;
}

function avgUniforms(geo: Pool2dGeometry, total: number, how: AvgDivisor) {
  return {
    ...windowUniforms(geo, total),
    include_pad: how.countIncludePad ? 1 : 0,
    divisor_override: how.divisorOverride ?? 0,
  };
}

/** Average pooling of `x` over `geo` (no autograd), in x's dtype. */
export function launchAvgPool2d(x: DeviceArray, geo: Pool2dGeometry, how: AvgDivisor): DeviceArray {
  const kernel = x.gpu.kernel(avgPool2dKernel, { dtype: x.dtype });
  return perElement(
    x,
    geo.outputShape,
    (y, total) => x.gpu.dispatch(kernel, { x, y }, avgUniforms(geo, total, how), groups(total)),
  );
}

/** The input gradient of average pooling from `g` (no autograd). */
export function launchAvgPool2dBackward(
  g: DeviceArray,
  geo: Pool2dGeometry,
  how: AvgDivisor,
): DeviceArray {
  const kernel = g.gpu.kernel(avgPool2dBackwardKernel, {
    dtype: g.dtype,
    disjoint: isDisjoint(geo),
  });
  return perElement(
    g,
    geo.inputShape,
    (dx, total) => g.gpu.dispatch(kernel, { g, dx }, avgUniforms(geo, total, how), groups(total)),
  );
}

function adaptiveUniforms(geo: Pool2dGeometry, total: number) {
  return { total, h: geo.h, w: geo.w, oh: geo.oh, ow: geo.ow };
}

/** Adaptive average pooling of `x` to `geo`'s [oh, ow] (no autograd), in x's dtype. */
export function launchAdaptiveAvgPool2d(x: DeviceArray, geo: Pool2dGeometry): DeviceArray {
  const kernel = x.gpu.kernel(adaptiveAvgPool2dKernel, { dtype: x.dtype });
  return perElement(
    x,
    geo.outputShape,
    (y, total) => x.gpu.dispatch(kernel, { x, y }, adaptiveUniforms(geo, total), groups(total)),
  );
}

/** The input gradient of adaptive average pooling from `g` (no autograd). */
export function launchAdaptiveAvgPool2dBackward(g: DeviceArray, geo: Pool2dGeometry): DeviceArray {
  const kernel = g.gpu.kernel(adaptiveAvgPool2dBackwardKernel, { dtype: g.dtype });
  return perElement(
    g,
    geo.inputShape,
    (dx, total) => g.gpu.dispatch(kernel, { g, dx }, adaptiveUniforms(geo, total), groups(total)),
  );
}
