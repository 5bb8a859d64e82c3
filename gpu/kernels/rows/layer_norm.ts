/**
 * LayerNorm over the last axis. The input is viewed as [rows, cols]; each
 * row (a thread, or `lanes` threads of a workgroup that holds several rows,
 * with vec4 loads where cols is a multiple of 4: see row_layout.ts and
 * row_width.ts) gets its mean and biased variance in f32 (two passes, so a
 * large mean does not cancel the variance away), writes y (in the input's
 * dtype, or the one the next op reads: an f32 residual stream normalised
 * straight into f16 or bf16 for the product after it, no cast) and saves the
 * per-row mean and rstd = 1/√(var + eps) (f32) for the backward pass and for
 * a recompute of y from them (`launchLayerNormFromStats`). Weight and bias
 * are optional f32 vectors of length cols; whether each is bound is part of
 * the config. x, y, g and dx go through the dtype accessors: f32, f16, bf16.
 *
 * Backward: the same row layout for dx, and column sums for dweight =
 * Σ_rows g·x̂ and dbias = Σ_rows g (f32; a workgroup per column on CPU
 * adapters, two coalesced stages on GPUs: layer_norm_columns.ts). The upstream gradient g
 * may have its own dtype (f16 from an f16 product into an f32 stream); dx
 * takes x's.
 *
 * Means multiply by 1/cols computed on the host instead of dividing in WGSL,
 * which may divide approximately (2.5 ulp): a row of one element must have
 * that element as its mean bit for bit, or its x̂ and dx are not exactly 0.
 */
import type { DType } from "../../base/dtype.ts";
import { defineKernel, optional } from "../../device/kernel.ts";
import { DeviceArray } from "../../device/device_array.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "../wgsl/grid.ts";
import {
  rowGrid,
  type RowLayout,
  rowPlan,
  wgslRowIndex,
  wgslRowLeader,
  wgslRowLoop,
  wgslRowReduce,
} from "./row_layout.ts";
import { ld, rowElement, type RowWidth, wgslRowStores, wgslRowWidth } from "./row_width.ts";
import { REDUCE_THREADS, WGSL_WORKGROUP_REDUCE } from "../wgsl/math.ts";
import { columnBlocksFor } from "./reduce_columns.ts";
import { launchLayerNormColumnGradsInto } from "./layer_norm_columns.ts";

/** Which optional vectors a kernel binds, and the storage dtype of x and dx. */
export type LayerNormConfig = {
  /** Storage dtype of x and dx (statistics and parameters are f32). */
  dtype: DType;
  /** Forward and dx: a weight is bound; parameter gradients: dweight is written. */
  weight: boolean;
  /** Forward: a bias is bound; parameter gradients: dbias is written. */
  bias: boolean;
};

/** A row kernel's config: the above plus how rows map to threads and how wide its loads are. */
type RowConfig = LayerNormConfig & { layout: RowLayout; lanes: number; width: RowWidth };

/**
 * The storage dtype of y, and whether the statistics are `saved` ones read
 * back (a recompute of y: no reductions, bit for bit the forward's y) rather
 * than computed and written.
 */
type ForwardConfig = { out: DType; saved: boolean };

/** The storage dtype of the upstream gradient g (backward). */
type GradDtype = { grad: DType };

/** The helpers and the entry point of a row kernel, up to the row's `base` unit and its length `n` in units. */
function rowStart(c: RowConfig): string {
  return `${wgslRowReduce(c.layout, c.lanes)}${wgslRowWidth(c.width)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${wgslRowIndex(c.layout, "rows", c.lanes)}
  let n = p.cols / ${c.width}u;
  let base = row * n;`;
}

/** `* w[j]` / `+ b[j]` where the config binds them (V-wide, f32). */
function affine(c: LayerNormConfig, v: string): string {
  return `${v}${c.weight ? " * w[j]" : ""}${c.bias ? " + b[j]" : ""}`;
}

/**
 * Forward: y, mean and rstd. With `saved`, mean and rstd are read instead:
 * y again from the forward's statistics, by the same expression.
 */
export const layerNormForwardKernel = defineKernel({
  name: "layer_norm_forward",
  bindings: (c: RowConfig & ForwardConfig) => [
    { name: "x", type: rowElement(c.dtype, c.width) },
    ...optional(c.weight, { name: "w", type: rowElement("f32", c.width) }),
    ...optional(c.bias, { name: "b", type: rowElement("f32", c.width) }),
    { name: "y", type: rowElement(c.out, c.width), write: true },
    { name: "mean", type: "f32", write: !c.saved },
    { name: "rstd", type: "f32", write: !c.saved },
  ],
  uniforms: { rows: "u32", cols: "u32", inv_cols: "f32", eps: "f32" },
  source: (c) => {
    const loop = wgslRowLoop(c.layout, "n", c.lanes);
    const x = ld(c.width, "x", "base + j");
    const statistics = c.saved
      ? `let mu = mean[row];
  let r = rstd[row];`
      : `var s = V(0.0);
  ${loop} { s += ${x}; }
  let mu = reduce_sum(hsum(s), lid) * p.inv_cols;
  var q = V(0.0);
  ${loop} { let d = ${x} - mu; q += d * d; }
  let r = 1.0 / sqrt(reduce_sum(hsum(q), lid) * p.inv_cols + p.eps);`;
    return `${rowStart(c)}
  ${statistics}
  ${
      wgslRowStores({ ...c, dtype: c.out }, loop, {
        name: "y",
        body: "",
        value: affine(c, `(${x} - mu) * r`),
      })
    }
  ${c.saved ? "" : `if (${wgslRowLeader(c.layout)} && in_rows) { mean[row] = mu; rstd[row] = r; }`}
}`;
  },
});

/** dx = rstd · (g·w − mean(g·w) − x̂ · mean(g·w·x̂)). */
export const layerNormBackwardKernel = defineKernel({
  name: "layer_norm_backward",
  bindings: (c: RowConfig & GradDtype) => [
    { name: "x", type: rowElement(c.dtype, c.width) },
    ...optional(c.weight, { name: "w", type: rowElement("f32", c.width) }),
    { name: "g", type: rowElement(c.grad, c.width) },
    { name: "mean", type: "f32" },
    { name: "rstd", type: "f32" },
    { name: "dx", type: rowElement(c.dtype, c.width), write: true },
  ],
  uniforms: { rows: "u32", cols: "u32", inv_cols: "f32" },
  source: (c) => {
    const loop = wgslRowLoop(c.layout, "n", c.lanes);
    const gw = `let gw = ${ld(c.width, "g", "base + j")}${c.weight ? " * w[j]" : ""};`;
    const x = ld(c.width, "x", "base + j");
    return `${rowStart(c)}
  let mu = mean[row];
  let r = rstd[row];
  var s1 = V(0.0);
  var s2 = V(0.0);
  ${loop} {
    ${gw}
    s1 += gw;
    s2 += gw * (${x} - mu) * r;
  }
  let m1 = reduce_sum(hsum(s1), lid) * p.inv_cols;
  let m2 = reduce_sum(hsum(s2), lid) * p.inv_cols;
  ${
      wgslRowStores(c, loop, {
        name: "dx",
        body: `${gw} let xh = (${x} - mu) * r;`,
        value: "r * (gw - m1 - xh * m2)",
      })
    }
}`;
  },
});

// NOTE: one workgroup per column strides over rows with stride `cols`: not
// coalesced on GPUs, which take the two-stage kernels of layer_norm_columns.ts.
/** dweight = Σ_rows g·x̂ and dbias = Σ_rows g, one workgroup per column (CPU adapters). */
export const layerNormParamGradKernel = defineKernel({
  name: "layer_norm_param_grad",
  bindings: (c: LayerNormConfig & GradDtype) => [
    { name: "x", type: c.dtype },
    { name: "g", type: c.grad },
    { name: "mean", type: "f32" },
    { name: "rstd", type: "f32" },
    ...optional(c.weight, { name: "dw", type: "f32", write: true }),
    ...optional(c.bias, { name: "db", type: "f32", write: true }),
  ],
  uniforms: { rows: "u32", cols: "u32" },
  source: (c) =>
    `${WGSL_WORKGROUP_REDUCE}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  let col = ${WGSL_WORKGROUP_INDEX};
  if (col >= p.cols) { return; }
  var sw = 0.0;
  var sb = 0.0;
  for (var r = lid; r < p.rows; r += ${REDUCE_THREADS}u) {
    let i = r * p.cols + col;
    let gv = ld_g(i);
    sb += gv;
    sw += gv * (ld_x(i) - mean[r]) * rstd[r];
  }
  sw = reduce_sum(sw, lid);
  sb = reduce_sum(sb, lid);
  if (lid == 0u) {${c.weight ? " dw[col] = sw;" : ""}${c.bias ? " db[col] = sb;" : ""} }
}`,
});

function rowsCols(x: DeviceArray): { rows: number; cols: number } {
  const cols = x.shape.at(-1) ?? 1;
  return { rows: x.shape.slice(0, -1).reduce((a, b) => a * b, 1), cols };
}

/** The statistics of a LayerNorm's rows, f32 [rows]: what backward and a recompute of y read. */
export interface LayerNormStats {
  /** Each row's mean. */
  mean: DeviceArray;
  /** Each row's 1/√(var + eps). */
  rstd: DeviceArray;
}

/** Dispatches the forward kernel: statistics computed (`stats` null) or read. */
function dispatchForward(
  x: DeviceArray,
  affine: { weight: DeviceArray | null; bias: DeviceArray | null; eps: number },
  y: DeviceArray,
  stats: LayerNormStats,
  saved: boolean,
): void {
  const { rows, cols } = rowsCols(x);
  if (rows * cols === 0) return;
  const { weight, bias, eps } = affine;
  const plan = rowPlan(x.gpu, cols);
  const config = {
    dtype: x.dtype,
    out: y.dtype,
    weight: weight !== null,
    bias: bias !== null,
    saved,
    ...plan,
  };
  const kernel = x.gpu.kernel(layerNormForwardKernel, config);
  const tensors = {
    x,
    y,
    mean: stats.mean,
    rstd: stats.rstd,
    ...(weight && { w: weight }),
    ...(bias && { b: bias }),
  };
  const uniforms = { rows, cols, inv_cols: 1 / cols, eps };
  x.gpu.dispatch(kernel, tensors, uniforms, rowGrid(plan, rows));
}

/**
 * y (in `out`, default x's dtype), and the per-row f32 `mean` and `rstd`
 * ([rows]) that the backward pass needs (no autograd).
 */
export function launchLayerNorm(
  x: DeviceArray,
  weight: DeviceArray | null,
  bias: DeviceArray | null,
  eps: number,
  out: DType = x.dtype,
): { y: DeviceArray } & LayerNormStats {
  const { rows } = rowsCols(x);
  const y = DeviceArray.empty(x.shape, out, x.gpu);
  const stats = {
    mean: DeviceArray.empty([rows], "f32", x.gpu),
    rstd: DeviceArray.empty([rows], "f32", x.gpu),
  };
  dispatchForward(x, { weight, bias, eps }, y, stats, false);
  return { y, ...stats };
}

/**
 * y again (in `out`) from statistics {@link launchLayerNorm} saved for the
 * same x, weight and bias: one elementwise pass, no reductions, and bit for
 * bit the y the forward wrote (the same expression of the same values).
 * No autograd.
 */
export function launchLayerNormFromStats(
  x: DeviceArray,
  affine: { weight: DeviceArray | null; bias: DeviceArray | null },
  stats: LayerNormStats,
  out: DType,
): DeviceArray {
  const y = DeviceArray.empty(x.shape, out, x.gpu);
  dispatchForward(x, { ...affine, eps: 0 }, y, stats, true);
  return y;
}

/** dx of LayerNorm from the saved x, mean, rstd, the weight (if any) and upstream `g` (no autograd). */
export function launchLayerNormBackward(
  x: DeviceArray,
  weight: DeviceArray | null,
  g: DeviceArray,
  mean: DeviceArray,
  rstd: DeviceArray,
): DeviceArray {
  const { rows, cols } = rowsCols(x);
  const dx = DeviceArray.empty(x.shape, x.dtype, x.gpu);
  if (rows * cols === 0) return dx;
  const plan = rowPlan(x.gpu, cols);
  const config = { dtype: x.dtype, grad: g.dtype, weight: weight !== null, bias: false, ...plan };
  const kernel = x.gpu.kernel(layerNormBackwardKernel, config);
  const tensors = { x, g, mean, rstd, dx, ...(weight && { w: weight }) };
  x.gpu.dispatch(kernel, tensors, { rows, cols, inv_cols: 1 / cols }, rowGrid(plan, rows));
  return dx;
}

/**
 * dweight = Σ_rows g·x̂ and/or dbias = Σ_rows g, f32 tensors of shape [cols]
 * (null where not asked for). No autograd.
 */
export function launchLayerNormParamGrads(
  x: DeviceArray,
  g: DeviceArray,
  mean: DeviceArray,
  rstd: DeviceArray,
  want: { weight: boolean; bias: boolean },
): { dw: DeviceArray | null; db: DeviceArray | null } {
  const { rows, cols } = rowsCols(x);
  const dw = want.weight ? DeviceArray.empty([cols], "f32", x.gpu) : null;
  const db = want.bias ? DeviceArray.empty([cols], "f32", x.gpu) : null;
  if (cols === 0 || (!dw && !db)) return { dw, db };
  if (columnBlocksFor(x.gpu, rows, cols)) {
    launchLayerNormColumnGradsInto(x, g, { mean, rstd }, { rows, cols }, { dw, db });
    return { dw, db };
  }
  const config = { dtype: x.dtype, grad: g.dtype, weight: want.weight, bias: want.bias };
  const kernel = x.gpu.kernel(layerNormParamGradKernel, config);
  const tensors = { x, g, mean, rstd, ...(dw && { dw }), ...(db && { db }) };
  x.gpu.dispatch(kernel, tensors, { rows, cols }, grid1d(cols));
  return { dw, db };
}
