/**
 * Cross-entropy from logits with integer class targets and optional label
 * smoothing ε, in f32 whatever the logits' dtype:
 *   loss_r = (1 − ε)·(lse_r − x[r, t_r]) + ε·(lse_r − mean_j x[r, j]),
 * with lse_r = log Σ_j exp(x[r, j]) computed stably. The forward also keeps
 * lse_r so the backward is one elementwise pass:
 *   dx[r, j] = g_r · (exp(x[r, j] − lse_r) − ((1 − ε)·[j = t_r] + ε / C)).
 */
import { type DType, wgslEnables } from "../dtype.ts";
import { defineKernel, f32Bits } from "../kernel.ts";
import { Tensor } from "../tensor.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./grid.ts";
import { REDUCE_THREADS, WGSL_LOWEST, WGSL_WORKGROUP_REDUCE } from "./wgsl_math.ts";

const LOOP = `for (var j = lid; j < p.classes; j += ${REDUCE_THREADS}u)`;
const WORKGROUP = 256;

/** Per-row losses and log-sum-exps. */
export const crossEntropyForwardKernel = defineKernel<{ dtype: DType }>({
  name: "cross_entropy_forward",
  wgsl: ({ dtype }) =>
    `${wgslEnables(dtype)}
struct Params { rows: u32, classes: u32, smoothing: u32 }
@group(0) @binding(0) var<storage, read> x: array<${dtype}>;
@group(0) @binding(1) var<storage, read> targets: array<i32>;
@group(0) @binding(2) var<storage, read_write> loss: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
${WGSL_WORKGROUP_REDUCE}
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
    let eps = bitcast<f32>(p.smoothing);
    let l = m + log(s);
    let target_logit = f32(x[base + u32(targets[row])]);
    loss[row] = (1.0 - eps) * (l - target_logit) + eps * (l - total / f32(p.classes));
    lse[row] = l;
  }
}`,
});

/** dx from the per-row upstream gradient g (f32 [rows]). */
export const crossEntropyBackwardKernel = defineKernel<{ dtype: DType }>({
  name: "cross_entropy_backward",
  wgsl: ({ dtype }) =>
    `${wgslEnables(dtype)}
struct Params { rows: u32, classes: u32, smoothing: u32 }
@group(0) @binding(0) var<storage, read> x: array<${dtype}>;
@group(0) @binding(1) var<storage, read> targets: array<i32>;
@group(0) @binding(2) var<storage, read> lse: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<${dtype}>;
@group(0) @binding(5) var<uniform> p: Params;
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  if (i >= p.rows * p.classes) { return; }
  let row = i / p.classes;
  let eps = bitcast<f32>(p.smoothing);
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
    [logits.buffer, targets.buffer, loss.buffer, lse.buffer],
    [rows, classes, f32Bits(smoothing)],
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
    [logits.buffer, targets.buffer, lse.buffer, g.buffer, dx.buffer],
    [rows, classes, f32Bits(smoothing)],
    grid1d(Math.ceil((rows * classes) / WORKGROUP)),
  );
  return dx;
}
