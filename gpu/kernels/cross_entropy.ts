/**
 * Cross-entropy from logits with integer class targets, as PyTorch's
 * `cross_entropy(weight, ignore_index, label_smoothing)`, in f32 whatever the
 * logits' dtype. With class weights w (all 1 when none are given), W = Σ_c w_c,
 * ε the smoothing and C the class count, a row r with target t is
 *   loss_r = (1 − ε)·w_t·(lse_r − x[r, t]) + (ε / C)·Σ_c w_c·(lse_r − x[r, c]),
 * and a row whose target is the ignore index has loss 0. The forward keeps,
 * per row, lse_r and the coefficient k_r = (1 − ε)·w_t + (ε / C)·W, so the
 * backward is one elementwise pass with p = exp(x − lse):
 *   dx[r, j] = g_r · (k_r·p[r, j] − (1 − ε)·w_t·[j = t] − (ε / C)·w_j).
 * It also writes w_t per row (0 when ignored): the divisor of the "mean".
 * (1 − ε) and ε / C come from the host, so no WGSL division rounds them.
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
import { REDUCE_THREADS, WGSL_LOWEST } from "./wgsl_math.ts";

const WORKGROUP = 256;

/** Which variant to compile: the logits' dtype, and whether class weights are bound. */
export type CrossEntropyConfig = { dtype: DType; weighted: boolean };

const UNIFORMS = {
  rows: "u32",
  classes: "u32",
  ignore_index: "i32",
  keep: "f32",
  per_class_smoothing: "f32",
} as const;

/** WGSL for w_c of class `c` (1 without weights). */
function classWeight(c: CrossEntropyConfig, index: string): string {
  return c.weighted ? `weight[${index}]` : "1.0";
}

/** Per-row losses, target weights and the (lse, k) pair the backward needs (rows laid out by length). */
export const crossEntropyForwardKernel = defineKernel({
  name: "cross_entropy_forward",
  bindings: (c: CrossEntropyConfig & { layout: RowLayout }) => [
    { name: "x", type: c.dtype },
    { name: "targets", type: "i32" },
    ...optional(c.weighted, { name: "weight", type: "f32" }),
    { name: "loss", type: "f32", write: true },
    { name: "target_weight", type: "f32", write: true },
    { name: "stats", type: "f32", write: true },
  ],
  uniforms: UNIFORMS,
  source: (c) => {
    const loop = wgslRowLoop(c.layout, "p.classes");
    return `${wgslRowReduce(c.layout)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${wgslRowIndex(c.layout, "rows")}
  let base = row * p.classes;
  var m = ${WGSL_LOWEST};
  var w_total = 0.0;
  ${loop} { m = max(m, f32(x[base + j])); w_total += ${classWeight(c, "j")}; }
  m = reduce_max(m, lid);
  w_total = reduce_sum(w_total, lid);
  // Σ w_c·(lse − x_c) = W·(lse − m) + Σ w_c·(m − x_c): two non-negative parts, no cancellation.
  var s = 0.0;
  var below_max = 0.0;
  ${loop} {
    let v = f32(x[base + j]);
    s += exp(v - m);
    below_max += ${classWeight(c, "j")} * (m - v);
  }
  s = reduce_sum(s, lid);
  below_max = reduce_sum(below_max, lid);
  if (${wgslRowLeader(c.layout)}) {
    let l = m + log(s);
    let t = targets[row];
    let kept = t != p.ignore_index;
    let tc = min(u32(max(t, 0)), p.classes - 1u);
    let w_t = select(0.0, ${classWeight(c, "tc")}, kept);
    let smooth_part = p.per_class_smoothing * (w_total * (l - m) + below_max);
    loss[row] = select(0.0, p.keep * w_t * (l - f32(x[base + tc])) + smooth_part, kept);
    target_weight[row] = w_t;
    stats[2u * row] = l;
    stats[2u * row + 1u] = select(0.0, p.keep * w_t + p.per_class_smoothing * w_total, kept);
  }
}`;
  },
});

/** dx from the per-row upstream gradient g (f32 [rows]). */
export const crossEntropyBackwardKernel = defineKernel({
  name: "cross_entropy_backward",
  bindings: (c: CrossEntropyConfig) => [
    { name: "x", type: c.dtype },
    { name: "targets", type: "i32" },
    ...optional(c.weighted, { name: "weight", type: "f32" }),
    { name: "stats", type: "f32" },
    { name: "g", type: "f32" },
    { name: "dx", type: c.dtype, write: true },
  ],
  uniforms: UNIFORMS,
  source: (c) =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  if (i >= p.rows * p.classes) { return; }
  let row = i / p.classes;
  let j = i % p.classes;
  let t = targets[row];
  let tc = min(u32(max(t, 0)), p.classes - 1u);
  let prob = exp(f32(x[i]) - stats[2u * row]);
  let hit = select(0.0, p.keep * ${classWeight(c, "tc")}, tc == j);
  let d = g[row] * (stats[2u * row + 1u] * prob - hit - p.per_class_smoothing * ${
      classWeight(c, "j")
    });
  dx[i] = ${c.dtype}(select(0.0, d, t != p.ignore_index));
}`,
});

/** What the cross-entropy kernels need besides the logits and targets. */
export interface CrossEntropyParams {
  /** Class weights, f32 [classes], or null for all ones. */
  weight: Tensor | null;
  /** The target id whose rows count for nothing. */
  ignoreIndex: number;
  /** Label smoothing ε in [0, 1]. */
  smoothing: number;
}

function launchConfig(logits: Tensor, params: CrossEntropyParams) {
  const [rows, classes] = logits.shape;
  const config = { dtype: logits.dtype, weighted: params.weight !== null };
  const uniforms = {
    rows,
    classes,
    ignore_index: params.ignoreIndex,
    keep: 1 - params.smoothing,
    per_class_smoothing: params.smoothing / classes,
  };
  const weight = params.weight ? { weight: params.weight } : {};
  return { rows, classes, config, uniforms, weight };
}

/** Per-row results of {@link launchCrossEntropy}, all f32. */
export interface CrossEntropyRows {
  /** Loss of each row [rows]. */
  loss: Tensor;
  /** w_t of each row, 0 where ignored [rows]. */
  targetWeight: Tensor;
  /** lse and k of each row [rows, 2], for the backward. */
  stats: Tensor;
}

/** Per-row losses for logits [rows, classes]. No autograd. */
export function launchCrossEntropy(
  logits: Tensor,
  targets: Tensor,
  params: CrossEntropyParams,
): CrossEntropyRows {
  const { rows, classes, config, uniforms, weight } = launchConfig(logits, params);
  const layout = rowLayout(logits.gpu, classes);
  const loss = Tensor.empty([rows], "f32", logits.gpu);
  const targetWeight = Tensor.empty([rows], "f32", logits.gpu);
  const stats = Tensor.empty([rows, 2], "f32", logits.gpu);
  if (rows === 0) return { loss, targetWeight, stats };
  logits.gpu.dispatch(
    logits.gpu.kernel(crossEntropyForwardKernel, { ...config, layout }),
    { x: logits, targets, ...weight, loss, target_weight: targetWeight, stats },
    uniforms,
    rowGrid(layout, rows),
  );
  return { loss, targetWeight, stats };
}

/** The logits' gradient from per-row gradients `g` (f32 [rows]). No autograd. */
export function launchCrossEntropyBackward(
  logits: Tensor,
  targets: Tensor,
  stats: Tensor,
  g: Tensor,
  params: CrossEntropyParams,
): Tensor {
  const { rows, classes, config, uniforms, weight } = launchConfig(logits, params);
  const dx = Tensor.empty(logits.shape, logits.dtype, logits.gpu);
  if (rows * classes === 0) return dx;
  logits.gpu.dispatch(
    logits.gpu.kernel(crossEntropyBackwardKernel, config),
    { x: logits, targets, ...weight, stats, g, dx },
    uniforms,
    grid1d(Math.ceil((rows * classes) / WORKGROUP)),
  );
  return dx;
}
