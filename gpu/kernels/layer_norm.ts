/**
 * LayerNorm over the last axis. The input is viewed as [rows, cols]; each
 * row (a workgroup per row, or a thread per short row: see row_layout.ts)
 * gets its mean and biased variance in f32 (two
 * passes, so a large mean does not cancel the variance away), writes y (in
 * the input's dtype, or the one the next op reads: an f32 residual stream
 * normalised straight into f16 for the product after it, no cast) and saves the per-row mean and rstd = 1/√(var + eps) (f32) for
 * the backward pass. Weight and bias are optional f32 vectors of length cols;
 * whether each is bound is part of the config.
 *
 * Backward: the same row layout for dx, and one workgroup per column for
 * dweight = Σ_rows g·x̂ and dbias = Σ_rows g (f32). The upstream gradient g
 * may have its own dtype (f16 from an f16 product into an f32 stream); dx
 * takes x's.
 *
 * Means multiply by 1/cols computed on the host instead of dividing in WGSL,
 * which may divide approximately (2.5 ulp): a row of one element must have
 * that element as its mean bit for bit, or its x̂ and dx are not exactly 0.
 */
import type { DType } from "../dtype.ts";
import { defineKernel, optional } from "../kernel.ts";
import { Tensor } from "../tensor.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./grid.ts";
import {
  rowGrid,
  type RowLayout,
  rowLayout,
  wgslRowIndex,
  wgslRowLeader,
  wgslRowLoop,
  wgslRowReduce,
} from "./row_layout.ts";
import { REDUCE_THREADS, WGSL_WORKGROUP_REDUCE } from "./wgsl_math.ts";
import { columnBlocksFor } from "./reduce_columns.ts";
import { launchLayerNormColumnGrads } from "./layer_norm_columns.ts";

/** Which optional vectors a kernel binds, and the storage dtype of x and dx. */
export type LayerNormConfig = {
  /** Storage dtype of x and dx (statistics and parameters are f32). */
  dtype: DType;
  /** Forward and dx: a weight is bound; parameter gradients: dweight is written. */
  weight: boolean;
  /** Forward: a bias is bound; parameter gradients: dbias is written. */
  bias: boolean;
};

/** A row kernel's config: the above plus how rows map to threads. */
type RowConfig = LayerNormConfig & { layout: RowLayout };

/** The storage dtype of y (forward). */
type OutDtype = { out: DType };

/** The storage dtype of the upstream gradient g (backward). */
type GradDtype = { grad: DType };

function rowStart(layout: RowLayout): string {
  return `${wgslRowIndex(layout, "rows")}
  let base = row * p.cols;
  let inv_n = p.inv_cols;`;
}

/** Forward: y, mean and rstd, one workgroup per row. */
export const layerNormForwardKernel = defineKernel({
  name: "layer_norm_forward",
  bindings: (c: RowConfig & OutDtype) => [
    { name: "x", type: c.dtype },
    ...optional(c.weight, { name: "w", type: "f32" }),
    ...optional(c.bias, { name: "b", type: "f32" }),
    { name: "y", type: c.out, write: true },
    { name: "mean", type: "f32", write: true },
    { name: "rstd", type: "f32", write: true },
  ],
  uniforms: { rows: "u32", cols: "u32", inv_cols: "f32", eps: "f32" },
  source: (c) => {
    const loop = wgslRowLoop(c.layout, "p.cols");
    return `${wgslRowReduce(c.layout)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${rowStart(c.layout)}
  var s = 0.0;
  ${loop} { s += f32(x[base + j]); }
  let mu = reduce_sum(s, lid) * inv_n;
  var q = 0.0;
  ${loop} { let d = f32(x[base + j]) - mu; q += d * d; }
  let r = 1.0 / sqrt(reduce_sum(q, lid) * inv_n + p.eps);
  ${loop} {
    let v = (f32(x[base + j]) - mu) * r${c.weight ? " * w[j]" : ""}${c.bias ? " + b[j]" : ""};
    y[base + j] = ${c.out}(v);
  }
  if (${wgslRowLeader(c.layout)}) { mean[row] = mu; rstd[row] = r; }
}`;
  },
});

/** dx = rstd · (g·w − mean(g·w) − x̂ · mean(g·w·x̂)), one workgroup per row. */
export const layerNormBackwardKernel = defineKernel({
  name: "layer_norm_backward",
  bindings: (c: RowConfig & GradDtype) => [
    { name: "x", type: c.dtype },
    ...optional(c.weight, { name: "w", type: "f32" }),
    { name: "g", type: c.grad },
    { name: "mean", type: "f32" },
    { name: "rstd", type: "f32" },
    { name: "dx", type: c.dtype, write: true },
  ],
  uniforms: { rows: "u32", cols: "u32", inv_cols: "f32" },
  source: (c) => {
    const loop = wgslRowLoop(c.layout, "p.cols");
    return `${wgslRowReduce(c.layout)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${rowStart(c.layout)}
  let mu = mean[row];
  let r = rstd[row];
  var s1 = 0.0;
  var s2 = 0.0;
  ${loop} {
    let gw = f32(g[base + j])${c.weight ? " * w[j]" : ""};
    s1 += gw;
    s2 += gw * (f32(x[base + j]) - mu) * r;
  }
  let m1 = reduce_sum(s1, lid) * inv_n;
  let m2 = reduce_sum(s2, lid) * inv_n;
  ${loop} {
    let gw = f32(g[base + j])${c.weight ? " * w[j]" : ""};
    let xh = (f32(x[base + j]) - mu) * r;
    dx[base + j] = ${c.dtype}(r * (gw - m1 - xh * m2));
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
    let gv = f32(g[i]);
    sb += gv;
    sw += gv * (f32(x[i]) - mean[r]) * rstd[r];
  }
  sw = reduce_sum(sw, lid);
  sb = reduce_sum(sb, lid);
  if (lid == 0u) {${c.weight ? " dw[col] = sw;" : ""}${c.bias ? " db[col] = sb;" : ""} }
}`,
});

function rowsCols(x: Tensor): { rows: number; cols: number } {
  const cols = x.shape.at(-1) ?? 1;
  return { rows: x.shape.slice(0, -1).reduce((a, b) => a * b, 1), cols };
}

/**
 * y (in `out`, default x's dtype), and the per-row f32 `mean` and `rstd`
 * ([rows]) that the backward pass needs (no autograd).
 */
export function launchLayerNorm(
  x: Tensor,
  weight: Tensor | null,
  bias: Tensor | null,
  eps: number,
  out: DType = x.dtype,
): { y: Tensor; mean: Tensor; rstd: Tensor } {
  const { rows, cols } = rowsCols(x);
  const y = Tensor.empty(x.shape, out, x.gpu);
  const mean = Tensor.empty([rows], "f32", x.gpu);
  const rstd = Tensor.empty([rows], "f32", x.gpu);
  if (rows * cols === 0) return { y, mean, rstd };
  const layout = rowLayout(x.gpu, cols);
  const config = {
    dtype: x.dtype,
    out,
    weight: weight !== null,
    bias: bias !== null,
    layout,
  };
  const kernel = x.gpu.kernel(layerNormForwardKernel, config);
  const tensors = { x, y, mean, rstd, ...(weight && { w: weight }), ...(bias && { b: bias }) };
  const uniforms = { rows, cols, inv_cols: 1 / cols, eps };
  x.gpu.dispatch(kernel, tensors, uniforms, rowGrid(layout, rows));
  return { y, mean, rstd };
}

/** dx of LayerNorm from the saved x, mean, rstd, the weight (if any) and upstream `g` (no autograd). */
export function launchLayerNormBackward(
  x: Tensor,
  weight: Tensor | null,
  g: Tensor,
  mean: Tensor,
  rstd: Tensor,
): Tensor {
  const { rows, cols } = rowsCols(x);
  const dx = Tensor.empty(x.shape, x.dtype, x.gpu);
  if (rows * cols === 0) return dx;
  const layout = rowLayout(x.gpu, cols);
  const config = { dtype: x.dtype, grad: g.dtype, weight: weight !== null, bias: false, layout };
  const kernel = x.gpu.kernel(layerNormBackwardKernel, config);
  const tensors = { x, g, mean, rstd, dx, ...(weight && { w: weight }) };
  x.gpu.dispatch(kernel, tensors, { rows, cols, inv_cols: 1 / cols }, rowGrid(layout, rows));
  return dx;
}

/**
 * dweight = Σ_rows g·x̂ and/or dbias = Σ_rows g, f32 tensors of shape [cols]
 * (null where not asked for). No autograd.
 */
export function launchLayerNormParamGrads(
  x: Tensor,
  g: Tensor,
  mean: Tensor,
  rstd: Tensor,
  want: { weight: boolean; bias: boolean },
): { dw: Tensor | null; db: Tensor | null } {
  const { rows, cols } = rowsCols(x);
  const dw = want.weight ? Tensor.empty([cols], "f32", x.gpu) : null;
  const db = want.bias ? Tensor.empty([cols], "f32", x.gpu) : null;
  if (cols === 0 || (!dw && !db)) return { dw, db };
  if (columnBlocksFor(x.gpu, rows, cols)) {
    launchLayerNormColumnGrads(x, g, { mean, rstd }, { rows, cols }, { dw, db });
    return { dw, db };
  }
  const config = { dtype: x.dtype, grad: g.dtype, weight: want.weight, bias: want.bias };
  const kernel = x.gpu.kernel(layerNormParamGradKernel, config);
  const tensors = { x, g, mean, rstd, ...(dw && { dw }), ...(db && { db }) };
  x.gpu.dispatch(kernel, tensors, { rows, cols }, grid1d(cols));
  return { dw, db };
}
