/**
 * 2-D convolution (NCHW, weights [O, C/groups, KH, KW]) as three implicit
 * GEMMs on the shared tiling generator (`gemm.ts`), one per group (the
 * dispatch's z): the im2col gather happens inside the operand loads, with
 * zeros in the padding, so no unfolded copy of the input is ever written.
 *
 * - forward: rows (n, oh, ow), columns o, reduction (c, kh, kw):
 *   y = x̃ · Wᵀ (+ bias, then ReLU).
 * - input gradient: rows (n, ih, iw), columns c, reduction (o, kh, kw):
 *   dx[ih, iw] gathers dy[oh, ow] where oh·s − p + kh·d = ih.
 * - weight gradient: rows o, columns (c, kh, kw), reduction (n, oh, ow),
 *   split into `splits` chunks of the reduction (more workgroups when the
 *   output is small and the reduction long); the chunks' f32 partial sums
 *   are added by a reduction afterwards.
 *
 * f32 accumulation whatever the storage dtype. Indices are clamped into range
 * before every load, and padding reads are replaced by zeros.
 */
import type { MatmulTiling } from "./settings.ts";
import type { DType } from "../../base/dtype.ts";
import { defineKernel, optional } from "../../device/kernel.ts";
import { DeviceArray } from "../../device/device_array.ts";
import {
  checkGemmLoops,
  gemmGrid,
  type GemmIo,
  gemmSplit,
  gemmWgsl,
  transposedIo,
} from "./gemm.ts";
import { launchReduce } from "../reduce.ts";
import { kindFamily } from "./tilings.ts";

/** Geometry of one convolution. */
export interface Conv2dGeometry {
  /** Batch N. */
  batch: number;
  /** Input channels C (all groups). */
  inChannels: number;
  /** Input height. */
  inH: number;
  /** Input width. */
  inW: number;
  /** Output channels O (all groups). */
  outChannels: number;
  /** Output height. */
  outH: number;
  /** Output width. */
  outW: number;
  /** Kernel height. */
  kH: number;
  /** Kernel width. */
  kW: number;
  /** Vertical stride. */
  strideH: number;
  /** Horizontal stride. */
  strideW: number;
  /** Top padding (the bottom padding is implied by outH). */
  padH: number;
  /** Left padding (the right padding is implied by outW). */
  padW: number;
  /** Vertical dilation. */
  dilationH: number;
  /** Horizontal dilation. */
  dilationW: number;
  /** Groups (C and O are multiples of it). */
  groups: number;
}

/** The dtypes and epilogue of a convolution kernel. */
type ConvDtypes = {
  /** Storage dtype of the two operands. */
  dtype: DType;
  /** Storage dtype of the result. */
  out: DType;
  /** Forward: bias dtype, or "none". */
  bias: DType | "none";
  /** Forward: ReLU fused after the bias. */
  relu: boolean;
  /** Input gradient: both strides are 1 (no divisibility test per tap). */
  unitStride: boolean;
};

/**
 * Which of the three products, and what changes its code. Operands are read
 * and results written through the `ld_`/`st_` accessors (gpu/device/kernel.ts), so
 * one source serves f32, f16 and bf16.
 */
export type Conv2dConfig = MatmulTiling & ConvDtypes & {
  pass: "forward" | "input_grad" | "weight_grad";
  /** Computed as the transposed product (rows ↔ columns; see `transposedIo`). */
  transposed: boolean;
};

const UNIFORMS = {
  m: "u32",
  n: "u32",
  k: "u32",
  in_c: "u32",
  cg: "u32",
  in_h: "u32",
  in_w: "u32",
  out_c: "u32",
  og: "u32",
  out_h: "u32",
  out_w: "u32",
  k_w: "u32",
  kk: "u32",
  s_h: "u32",
  s_w: "u32",
  p_h: "u32",
  p_w: "u32",
  d_h: "u32",
  d_w: "u32",
  splits: "u32",
  k_total: "u32",
} as const;

/** Input taps: x at an output position's origin plus a kernel tap, 0 in the padding. */
const WGSL_INPUT_TAPS = `
struct Origin { base: u32, ih: i32, iw: i32 }
struct Tap { off: u32, dh: i32, dw: i32 }
// The x offset of image n's first channel of group g, and the input row and
// column of the top-left tap of output position pos = (oh, ow).
fn origin_of(n: u32, pos: u32, g: u32) -> Origin {
  return Origin((n * p.in_c + g * p.cg) * p.in_h * p.in_w,
                i32((pos / p.out_w) * p.s_h) - i32(p.p_h),
                i32((pos % p.out_w) * p.s_w) - i32(p.p_w));
}
// Channel offset and kernel offsets of t = (c, kh, kw).
fn tap_of(t: u32) -> Tap {
  let r = t % p.kk;
  return Tap((t / p.kk) * p.in_h * p.in_w, i32((r / p.k_w) * p.d_h), i32((r % p.k_w) * p.d_w));
}
fn x_at(o: Origin, t: Tap) -> f32 {
  let ih = o.ih + t.dh;
  let iw = o.iw + t.dw;
  let inside = ih >= 0 && ih < i32(p.in_h) && iw >= 0 && iw < i32(p.in_w);
  let i = o.base + t.off + u32(clamp(ih, 0, i32(p.in_h) - 1)) * p.in_w +
    u32(clamp(iw, 0, i32(p.in_w) - 1));
  return select(0.0, ld_x(i), inside);
}
`;

/** y = conv(x, w): rows are output positions (n, oh, ow) of group z's channels. */
function forwardIo(c: Conv2dConfig): GemmIo {
  return {
    prelude: `${WGSL_INPUT_TAPS}
fn out_origin(row: u32, g: u32) -> Origin {
  let plane = p.out_h * p.out_w;
  return origin_of(row / plane, row % plane, g);
}
fn y_index(row: u32, channel: u32) -> u32 {
  let plane = p.out_h * p.out_w;
  return ((row / plane) * p.out_c + channel) * plane + row % plane;
}
`,
    setup: "let g = z;",
    aRow: (i, row) => `let o${i} = out_origin(${row}, g);`,
    bCol: (j, col) => `let wo${j} = (g * p.og + ${col}) * p.k;`,
    kStep: "let tp = tap_of(k);",
    aLoad: (i) => `x_at(o${i}, tp)`,
    bLoad: (j) => `ld_w(wo${j} + k)`,
    aAt: (row, k) => `x_at(out_origin(${row}, g), tap_of(${k}))`,
    bAt: (k, col) => `ld_w((g * p.og + ${col}) * p.k + ${k})`,
    store: (row, col, v) => `st_y(y_index(${row}, g * p.og + ${col}), ${v});`,
    bias: c.bias === "none" ? undefined : (_row, col) => `ld_bias(g * p.og + ${col})`,
  };
}

/** dx = convᵀ(dy, w): rows are input positions (n, ih, iw) of group z's channels. */
function inputGradIo(c: Conv2dConfig): GemmIo {
  // The tap (o, kh, kw) reaches input (ih, iw) from output (oh, ow) when
  // oh·s_h = ih + p_h − kh·d_h (and likewise for w), inside the output.
  const toOutput = c.unitStride
    ? "let oh = sh; let ow = sw; let hit = sh >= 0 && sw >= 0;"
    : `let oh = sh / i32(p.s_h); let ow = sw / i32(p.s_w);
  let hit = sh >= 0 && sw >= 0 && oh * i32(p.s_h) == sh && ow * i32(p.s_w) == sw;`;
  return {
    prelude: `
struct InPos { base: u32, th: i32, tw: i32 }
struct OutTap { off: u32, dh: i32, dw: i32, w: u32 }
// dy's offset of image n's first channel of group g, and ih + p_h, iw + p_w.
fn in_pos(row: u32, g: u32) -> InPos {
  let plane = p.in_h * p.in_w;
  let pos = row % plane;
  return InPos(((row / plane) * p.out_c + g * p.og) * p.out_h * p.out_w,
               i32(pos / p.in_w + p.p_h), i32(pos % p.in_w + p.p_w));
}
// For t = (o, kh, kw): dy's channel offset, the kernel offsets, and w's offset of (o, 0, kh, kw).
fn out_tap(t: u32, g: u32) -> OutTap {
  let o = t / p.kk;
  let r = t % p.kk;
  return OutTap(o * p.out_h * p.out_w, i32((r / p.k_w) * p.d_h), i32((r % p.k_w) * p.d_w),
                (g * p.og + o) * p.cg * p.kk + r);
}
fn dy_at(q: InPos, t: OutTap) -> f32 {
  let sh = q.th - t.dh;
  let sw = q.tw - t.dw;
  ${toOutput}
  let inside = hit && oh < i32(p.out_h) && ow < i32(p.out_w);
  let i = q.base + t.off + u32(clamp(oh, 0, i32(p.out_h) - 1)) * p.out_w +
    u32(clamp(ow, 0, i32(p.out_w) - 1));
  return select(0.0, ld_dy(i), inside);
}
fn dx_index(row: u32, channel: u32) -> u32 {
  let plane = p.in_h * p.in_w;
  return ((row / plane) * p.in_c + channel) * plane + row % plane;
}
`,
    setup: "let g = z;",
    aRow: (i, row) => `let q${i} = in_pos(${row}, g);`,
    bCol: (j, col) => `let wc${j} = ${col} * p.kk;`,
    kStep: "let ot = out_tap(k, g);",
    aLoad: (i) => `dy_at(q${i}, ot)`,
    bLoad: (j) => `ld_w(ot.w + wc${j})`,
    aAt: (row, k) => `dy_at(in_pos(${row}, g), out_tap(${k}, g))`,
    bAt: (k, col) => `ld_w(out_tap(${k}, g).w + ${col} * p.kk)`,
    store: (row, col, v) => `st_dx(dx_index(${row}, g * p.cg + ${col}), ${v});`,
  };
}

/** dw = dyᵀ · x̃ over one chunk of (n, oh, ow): rows o, columns (c, kh, kw). */
function weightGradIo(_c: Conv2dConfig): GemmIo {
  return {
    prelude: `${WGSL_INPUT_TAPS}
struct Sample { dy: u32, at: Origin, valid: bool }
// Reduction index s = (n, oh, ow) (past the end in the last chunk: valid false).
fn sample_of(s: u32, g: u32) -> Sample {
  let plane = p.out_h * p.out_w;
  let sc = min(s, p.k_total - 1u);
  let n = sc / plane;
  let pos = sc % plane;
  return Sample((n * p.out_c + g * p.og) * plane + pos, origin_of(n, pos, g), s < p.k_total);
}
fn dy_of(s: Sample, row: u32) -> f32 {
  return select(0.0, ld_dy(s.dy + row * p.out_h * p.out_w), s.valid);
}
fn x_of(s: Sample, t: Tap) -> f32 {
  return select(0.0, x_at(s.at, t), s.valid);
}
`,
    setup: `let g = z / p.splits;
  let chunk = z % p.splits;
  let k_base = chunk * p.k;`,
    aRow: (i, row) => `let r${i} = ${row};`,
    bCol: (j, col) => `let tp${j} = tap_of(${col});`,
    kStep: "let s = sample_of(k_base + k, g);",
    aLoad: (i) => `dy_of(s, r${i})`,
    bLoad: (j) => `x_of(s, tp${j})`,
    aAt: (row, k) => `dy_of(sample_of(k_base + ${k}, g), ${row})`,
    bAt: (k, col) => `x_of(sample_of(k_base + ${k}, g), tap_of(${col}))`,
    // [splits, O, C/groups·KH·KW]: with one chunk, the weight's own layout.
    store: (row, col, v) =>
      `st_dw((chunk * p.out_c + g * p.og + ${row}) * p.cg * p.kk + ${col}, ${v});`,
  };
}

const IO = { forward: forwardIo, input_grad: inputGradIo, weight_grad: weightGradIo };

/** The convolution kernel family: one compiled kernel per pass, dtypes and tiling. */
export const conv2dKernel = defineKernel({
  name: "conv2d",
  bindings: (c: Conv2dConfig) => {
    if (c.pass === "forward") {
      return [
        { name: "x", type: c.dtype },
        { name: "w", type: c.dtype },
        { name: "y", type: c.out, write: true },
        ...optional(c.bias !== "none", { name: "bias", type: c.bias as DType }),
      ];
    }
    if (c.pass === "input_grad") {
      return [
        { name: "dy", type: c.dtype },
        { name: "w", type: c.dtype },
        { name: "dx", type: c.out, write: true },
      ];
    }
    return [
      { name: "dy", type: c.dtype },
      { name: "x", type: c.dtype },
      { name: "dw", type: c.out, write: true },
    ];
  },
  uniforms: UNIFORMS,
  source: (c) => {
    const io = IO[c.pass](c);
    return gemmWgsl(c, c.transposed ? transposedIo(io) : io, c.relu ? "relu" : "none");
  },
});

/** The uniforms every pass shares, from the geometry. */
function geometryUniforms(g: Conv2dGeometry) {
  return {
    in_c: g.inChannels,
    cg: g.inChannels / g.groups,
    in_h: g.inH,
    in_w: g.inW,
    out_c: g.outChannels,
    og: g.outChannels / g.groups,
    out_h: g.outH,
    out_w: g.outW,
    k_w: g.kW,
    kk: g.kH * g.kW,
    s_h: g.strideH,
    s_w: g.strideW,
    p_h: g.padH,
    p_w: g.padW,
    d_h: g.dilationH,
    d_w: g.dilationW,
  };
}

/** Per-group GEMM sizes of the three passes. */
export function conv2dProblems(g: Conv2dGeometry) {
  const cg = g.inChannels / g.groups, og = g.outChannels / g.groups, kk = g.kH * g.kW;
  const outPositions = g.batch * g.outH * g.outW;
  return {
    forward: { m: outPositions, n: og, k: cg * kk },
    inputGrad: { m: g.batch * g.inH * g.inW, n: cg, k: og * kk },
    weightGrad: { m: og, n: cg * kk, k: outPositions },
  };
}

/**
 * Whether to compute the product transposed: when it has fewer columns than
 * rows (channels against positions), which fills the tiles and, on CPU
 * adapters, lets the SIMD lanes walk neighbouring positions.
 */
function transposeFor(size: { m: number; n: number }): boolean {
  return size.n < size.m;
}

interface Dispatch {
  pass: Conv2dConfig["pass"];
  tiling: MatmulTiling;
  size: { m: number; n: number; k: number };
  depth: number;
  splits?: number;
  kTotal?: number;
}

function dispatchConv(
  g: Conv2dGeometry,
  d: Dispatch,
  config: ConvDtypes,
  buffers: Record<string, DeviceArray | undefined>,
): void {
  const gpu = Object.values(buffers)[0]!.gpu;
  const { k } = d.size;
  checkGemmLoops(gpu, k, d.tiling, "conv2d");
  const transposed = transposeFor(d.size);
  const [m, n] = transposed ? [d.size.n, d.size.m] : [d.size.m, d.size.n];
  const kernel = gpu.kernel(kindFamily(conv2dKernel, d.tiling), {
    ...d.tiling,
    ...config,
    pass: d.pass,
    transposed,
  });
  gpu.dispatch(
    kernel,
    buffers,
    { ...geometryUniforms(g), m, n, k, splits: d.splits ?? 1, k_total: d.kTotal ?? k },
    gemmGrid(d.tiling, m, n, d.depth),
    { flops: 2 * m * n * k * d.depth },
  );
}

/** y = conv2d(x, w) (+ bias, then ReLU) into a new tensor [N, O, outH, outW] of x's dtype. */
export function launchConv2d(
  x: DeviceArray,
  w: DeviceArray,
  g: Conv2dGeometry,
  tiling: MatmulTiling,
  epilogue: { bias?: DeviceArray; relu?: boolean } = {},
): DeviceArray {
  const y = DeviceArray.empty([g.batch, g.outChannels, g.outH, g.outW], x.dtype, x.gpu);
  if (y.size === 0) return y;
  const size = conv2dProblems(g).forward;
  const config: ConvDtypes = {
    dtype: x.dtype,
    out: y.dtype,
    bias: epilogue.bias?.dtype ?? "none",
    relu: epilogue.relu ?? false,
    unitStride: false,
  };
  const bias = epilogue.bias ? { bias: epilogue.bias } : {};
  dispatchConv(g, { pass: "forward", tiling, size, depth: g.groups }, config, {
    x,
    w,
    y,
    ...bias,
  });
  return y;
}

/** dx [N, C, H, W] (dy's dtype) from dy [N, O, outH, outW] and w. */
export function launchConv2dInputGrad(
  dy: DeviceArray,
  w: DeviceArray,
  g: Conv2dGeometry,
  tiling: MatmulTiling,
): DeviceArray {
  const dx = DeviceArray.empty([g.batch, g.inChannels, g.inH, g.inW], dy.dtype, dy.gpu);
  if (dx.size === 0) return dx;
  const config: ConvDtypes = {
    dtype: dy.dtype,
    out: dx.dtype,
    bias: "none",
    relu: false,
    unitStride: g.strideH === 1 && g.strideW === 1,
  };
  const size = conv2dProblems(g).inputGrad;
  dispatchConv(g, { pass: "input_grad", tiling, size, depth: g.groups }, config, { dy, w, dx });
  return dx;
}

/** dw [O, C/groups, KH, KW] in `out` dtype from dy and x (both of one dtype). */
export function launchConv2dWeightGrad(
  dy: DeviceArray,
  x: DeviceArray,
  g: Conv2dGeometry,
  tiling: MatmulTiling,
  out: DType,
): DeviceArray {
  const shape = [g.outChannels, g.inChannels / g.groups, g.kH, g.kW];
  const { m, n, k } = conv2dProblems(g).weightGrad;
  if (m * n === 0 || k === 0) return DeviceArray.filled(shape, 0, out, dy.gpu);
  // Split-K: more workgroups when the output is small and the reduction long.
  const { length: chunk, slices: splits } = gemmSplit(dy.gpu, tiling, { m, n, k }, g.groups);
  const partial = DeviceArray.empty([splits, ...shape], splits === 1 ? out : "f32", dy.gpu);
  const config: ConvDtypes = {
    dtype: dy.dtype,
    out: partial.dtype,
    bias: "none",
    relu: false,
    unitStride: false,
  };
  dispatchConv(
    g,
    {
      pass: "weight_grad",
      tiling,
      size: { m, n, k: chunk },
      depth: g.groups * splits,
      splits,
      kTotal: k,
    },
    config,
    { dy, x, dw: partial },
  );
  if (splits === 1) {
    const dw = partial.share(shape);
    partial.dispose();
    return dw;
  }
  const total = shape.reduce((a, b) => a * b, 1);
  const dw = launchReduce("sum", partial, { outer: 1, axis: splits, inner: total }, shape, { out });
  partial.dispose();
  return dw;
}

/** dbias [O] in `out` dtype: dy summed over images and positions. */
export function launchConv2dBiasGrad(dy: DeviceArray, g: Conv2dGeometry, out: DType): DeviceArray {
  const plane = g.outH * g.outW;
  const perImage = launchReduce(
    "sum",
    dy,
    { outer: g.batch * g.outChannels, axis: plane, inner: 1 },
    [g.batch, g.outChannels],
    { out: "f32" },
  );
  const db = launchReduce(
    "sum",
    perImage,
    { outer: 1, axis: g.batch, inner: g.outChannels },
    [g.outChannels],
    { out },
  );
  perImage.dispose();
  return db;
}
