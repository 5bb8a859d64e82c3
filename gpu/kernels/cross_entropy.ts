/**
 * Cross-entropy from logits with integer class targets and optional label
 * smoothing ε, in f32 whatever the logits' dtype:
 *   loss_r = (1 − ε)·(lse_r − x[r, t_r]) + ε·(lse_r − mean_j x[r, j]),
 * with lse_r = log Σ_j exp(x[r, j]) computed stably. The forward also keeps
 * lse_r so the backward is one elementwise pass:
 *   dx[r, j] = g_r · (exp(x[r, j] − lse_r) − ((1 − ε)·[j = t_r] + ε / C)).
 */
import type { DType } from "../dtype.ts";
import { defineKernel } from "../kernel.ts";
import { Tensor } from "../tensor.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./grid.ts";
import { REDUCE_THREADS, WGSL_LOWEST, WGSL_WORKGROUP_REDUCE } from "./wgsl_math.ts";

const LOOP = `for (var j = lid; j < p.classes; j += ${REDUCE_THREADS}u)`;
const WORKGROUP = 256;

/** Per-row losses and log-sum-exps. */
export const crossEntropyForwardKernel = defineKernel({
  name: "cross_entropy_forward",
  bindings: (c: { dtype: DType }) => [
    { name: "x", type: c.dtype },
    { name: "targets", type: "i32" },
    { name: "loss", type: "f32", write: true },
    { name: "lse", type: "f32", write: true },
  ],
  uniforms: { rows: "u32", classes: "u32", smoothing: "f32" },
  source: () =>
    `${WGSL_WORKGROUP_REDUCE}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  let row = ${WGSL_WORKGROUP_INDEX};
  if (row >= p.rows) { return; }
  let base = row * p.classes;
  var m = ${WGSL_LOWEST};
  var total = 0.0;
  ${LOOP} { let v = f32(x[base + j]); m = max(m, v); total += v; }
  m = reduce_max(m, lid);
  total = reduce_sum(total, lid);
  var s = 0.0;
  ${LOOP} { s += exp(f32(x[base + j]) - m); }
  s = reduce_sum(s, lid);
  if (lid == 0u) {
    let eps = p.smoothing;
    let l = m + log(s);
    let target_logit = f32(x[base + u32(targets[row])]);
    loss[row] = (1.0 - eps) * (l - target_logit) + eps * (l - total / f32(p.classes));
    lse[row] = l;
  }
}`,
});

/** dx from the per-row upstream gradient g (f32 [rows]). */
export const crossEntropyBackwardKernel = defineKernel({
  name: "cross_entropy_backward",
  bindings: (c: { dtype: DType }) => [
    { name: "x", type: c.dtype },
    { name: "targets", type: "i32" },
    { name: "lse", type: "f32" },
    { name: "g", type: "f32" },
    { name: "dx", type: c.dtype, write: true },
  ],
  uniforms: { rows: "u32", classes: "u32", smoothing: "f32" },
  source: ({ dtype }) =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  if (i >= p.rows * p.classes) { return; }
  let row = i / p.classes;
  let eps = p.smoothing;
  let hit = select(0.0, 1.0 - eps, u32(targets[row]) == i % p.classes);
  let q = hit + eps / f32(p.classes);
  dx[i] = ${dtype}(g[row] * (exp(f32(x[i]) - lse[row]) - q));
}`,
});

/** Per-row losses and lse (both f32 [rows]) for logits [rows, classes]. No autograd. */
export function launchCrossEntropy(
  logits: Tensor,
  targets: Tensor,
  smoothing: number,
): { loss: Tensor; lse: Tensor } {
  const [rows, classes] = logits.shape;
  const loss = Tensor.empty([rows], "f32", logits.gpu);
  const lse = Tensor.empty([rows], "f32", logits.gpu);
  if (rows === 0) return { loss, lse };
  const kernel = logits.gpu.kernel(crossEntropyForwardKernel, { dtype: logits.dtype });
  logits.gpu.dispatch(
    kernel,
    { x: logits, targets, loss, lse },
    { rows, classes, smoothing },
    grid1d(rows),
  );
  return { loss, lse };
}

/** The logits' gradient from per-row gradients `g` (f32 [rows]). No autograd. */
export function launchCrossEntropyBackward(
  logits: Tensor,
  targets: Tensor,
  lse: Tensor,
  g: Tensor,
  smoothing: number,
): Tensor {
  const [rows, classes] = logits.shape;
  const dx = Tensor.empty(logits.shape, logits.dtype, logits.gpu);
  if (rows * classes === 0) return dx;
  const kernel = logits.gpu.kernel(crossEntropyBackwardKernel, { dtype: logits.dtype });
  logits.gpu.dispatch(
    kernel,
    { x: logits, targets, lse, g, dx },
    { rows, classes, smoothing },
    grid1d(Math.ceil((rows * classes) / WORKGROUP)),
  );
  return dx;
}
