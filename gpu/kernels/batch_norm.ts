/**
 * BatchNorm over [N, C, S] (S = product of the spatial extents, 1 for [N, C]).
 * One workgroup per channel. Everything but the storage of x, y, dy and dx is
 * f32: parameters, running statistics, batch statistics and all arithmetic.
 *
 * Forward, training: the channel's mean and biased variance over N·S values
 * (two passes), an optional in-place update of the running statistics on the
 * GPU (running = (1 − m)·running + m·stat, with the unbiased variance for
 * runningVar, as PyTorch), then y. Eval: the running statistics normalise.
 * Either way the mean and rstd used are saved (f32 [C]) for the backward pass,
 * so a later update of the running statistics cannot change the gradient.
 */
import type { DType } from "../base/dtype.ts";
import { fail, ValueError } from "../base/errors.ts";
import { defineKernel, optional } from "../device/kernel.ts";
import { DeviceArray } from "../device/device_array.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./wgsl/grid.ts";
import { REDUCE_THREADS, WGSL_WORKGROUP_REDUCE } from "./wgsl/math.ts";

/** Storage dtype of x, batch or running statistics, and which optional buffers are bound. */
export type BatchNormConfig = {
  /** Storage dtype of x and dx (everything else is f32, y and g as below). */
  dtype: DType;
  /** Batch statistics (true) or running statistics (false). */
  training: boolean;
  /** Training only: update the running statistics in place. */
  update: boolean;
  /**
   * Training with update: the cumulative moving average (PyTorch's
   * `momentum=None`): the factor is 1/(batches tracked + 1), read from the
   * counter on the GPU, instead of the `momentum` uniform.
   */
  cumulative: boolean;
  /** A weight is bound (backward: and dweight is written). */
  weight: boolean;
  /** Forward: a bias is bound; backward: dbias is written. */
  bias: boolean;
};

/**
 * The forward's config: the storage dtype of y too. Under autocast an f16 x
 * is read as it is and y written in f32, as if x had been cast up first.
 */
export type BatchNormForwardConfig = BatchNormConfig & { out: DType };

/** The backward's config: the storage dtype of the upstream gradient g too (dx takes x's). */
export type BatchNormBackwardConfig = BatchNormConfig & { grad: DType };

// inv_count is 1/(N·S) computed on the host: WGSL may divide approximately, and a
// mean must equal its only element bit for bit.
const UNIFORMS = {
  n: "u32",
  c: "u32",
  s: "u32",
  eps: "f32",
  momentum: "f32",
  inv_count: "f32",
  bessel: "f32",
} as const;

/** Reductions, and the index of element i (of N·S) of channel c in [N, C, S]. */
const PRELUDE = `${WGSL_WORKGROUP_REDUCE}
fn at(i: u32, c: u32) -> u32 { return ((i / p.s) * p.c + c) * p.s + i % p.s; }`;

const LOOP = `for (var i = lid; i < count; i += ${REDUCE_THREADS}u)`;
const START = `let c = ${WGSL_WORKGROUP_INDEX};
  if (c >= p.c) { return; }
  let count = p.n * p.s;`;

const BATCH_STATS = `var s = 0.0;
  ${LOOP} { s += ld_x(at(i, c)); }
  let mu = reduce_sum(s, lid) * p.inv_count;
  var q = 0.0;
  ${LOOP} { let d = ld_x(at(i, c)) - mu; q += d * d; }
  let v = reduce_sum(q, lid) * p.inv_count;
  let r = 1.0 / sqrt(v + p.eps);`;

/** The running-statistics update; `m` is the factor of the new batch statistic. */
const UPDATE = `if (lid == 0u) {
    running_mean[c] = (1.0 - m) * running_mean[c] + m * mu;
    running_var[c] = (1.0 - m) * running_var[c] + m * v * p.bessel;
  }`;

const RUNNING_STATS = `let mu = running_mean[c];
  let r = 1.0 / sqrt(running_var[c] + p.eps);`;

/** Forward: statistics, running-stat update and y, one workgroup per channel. */
export const batchNormForwardKernel = defineKernel({
  name: "batch_norm_forward",
  bindings: (c: BatchNormForwardConfig) => {
    const running = !c.training || c.update;
    return [
      { name: "x", type: c.dtype },
      ...optional(c.weight, { name: "w", type: "f32" }),
      ...optional(c.bias, { name: "b", type: "f32" }),
      ...optional(running, { name: "running_mean", type: "f32", write: c.update }),
      ...optional(running, { name: "running_var", type: "f32", write: c.update }),
      ...optional(c.update && c.cumulative, { name: "batches", type: "i32" }),
      { name: "y", type: c.out, write: true },
      { name: "mean", type: "f32", write: true },
      { name: "rstd", type: "f32", write: true },
    ];
  },
  uniforms: UNIFORMS,
  source: (c) =>
    `${PRELUDE}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${START}
  ${c.training ? BATCH_STATS : RUNNING_STATS}
  ${
      c.training && c.update
        ? `let m = ${c.cumulative ? "1.0 / f32(batches[0] + 1)" : "p.momentum"};\n  ${UPDATE}`
        : ""
    }
  if (lid == 0u) { mean[c] = mu; rstd[c] = r; }
  let scale = r${c.weight ? " * w[c]" : ""};
  ${LOOP} {
    let k = at(i, c);
    st_y(k, (ld_x(k) - mu) * scale${c.bias ? " + b[c]" : ""});
  }
}`,
});

/**
 * Backward, one workgroup per channel. Training: dx = w·rstd·(g − mean(g) − x̂·mean(g·x̂));
 * eval: dx = g·w·rstd. dweight = Σ g·x̂ and dbias = Σ g in both modes.
 */
export const batchNormBackwardKernel = defineKernel({
  name: "batch_norm_backward",
  bindings: (c: BatchNormBackwardConfig) => [
    { name: "x", type: c.dtype },
    { name: "g", type: c.grad },
    { name: "mean", type: "f32" },
    { name: "rstd", type: "f32" },
    ...optional(c.weight, { name: "w", type: "f32" }),
    { name: "dx", type: c.dtype, write: true },
    ...optional(c.weight, { name: "dw", type: "f32", write: true }),
    ...optional(c.bias, { name: "db", type: "f32", write: true }),
  ],
  uniforms: UNIFORMS,
  source: (c) =>
    `${PRELUDE}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${START}
  let mu = mean[c];
  let r = rstd[c];
  var sg = 0.0;
  var sgx = 0.0;
  ${LOOP} {
    let k = at(i, c);
    let gv = ld_g(k);
    sg += gv;
    sgx += gv * (ld_x(k) - mu) * r;
  }
  sg = reduce_sum(sg, lid);
  sgx = reduce_sum(sgx, lid);
  if (lid == 0u) {${c.weight ? " dw[c] = sgx;" : ""}${c.bias ? " db[c] = sg;" : ""} }
  let wr = r${c.weight ? " * w[c]" : ""};
  let mg = sg * p.inv_count;
  let mgx = sgx * p.inv_count;
  ${LOOP} {
    let k = at(i, c);
    let gv = ld_g(k);
    ${
      c.training
        ? "let xh = (ld_x(k) - mu) * r;\n    st_dx(k, wr * (gv - mg - xh * mgx));"
        : "st_dx(k, gv * wr);"
    }
  }
}`,
});

/** num_batches_tracked += 1 (BatchNorm's counter, i32 [], as PyTorch's int64 buffer). */
export const countKernel = defineKernel({
  name: "batch_norm_count",
  bindings: (_: Record<string, never>) => [{ name: "batches", type: "i32", write: true }],
  uniforms: {},
  source: () =>
    `@compute @workgroup_size(1)
fn main() {
  batches[0] = batches[0] + 1;
}`,
});

/** 1/(N·S) and the Bessel correction N·S/(N·S − 1), in f64 on the host. */
function counts(view: BatchNormView): { inv_count: number; bessel: number } {
  const count = view.n * view.s;
  return { inv_count: 1 / Math.max(count, 1), bessel: count > 1 ? count / (count - 1) : 1 };
}

/** The [N, C, S] view of a BatchNorm input of rank 2 to 4. */
export interface BatchNormView {
  /** Batch size N. */
  n: number;
  /** Channels C (axis 1). */
  c: number;
  /** Product of the spatial extents (1 for [N, C]). */
  s: number;
}

/** Tensors of one BatchNorm forward launch. */
export interface BatchNormTensors {
  /** f32 [C], or null for no scale. */
  weight: DeviceArray | null;
  /** f32 [C], or null for no shift. */
  bias: DeviceArray | null;
  /** f32 [C]; read in eval mode, updated in place when training with update. */
  runningMean: DeviceArray;
  /** f32 [C]; read in eval mode, updated in place when training with update. */
  runningVar: DeviceArray;
  /** i32 []: batches seen in training, counted with every update (null: not counted). */
  numBatchesTracked?: DeviceArray | null;
}

/**
 * y (in `options.out`, default x's dtype), and the f32 [C] `mean` and `rstd`
 * it normalised with (no autograd). With `update` (training only) the running
 * statistics change in place.
 */
export function launchBatchNorm(
  x: DeviceArray,
  view: BatchNormView,
  t: BatchNormTensors,
  options: {
    training: boolean;
    update: boolean;
    momentum: number | null;
    eps: number;
    out?: DType;
  },
): { y: DeviceArray; mean: DeviceArray; rstd: DeviceArray } {
  const out = options.out ?? x.dtype;
  const y = DeviceArray.empty(x.shape, out, x.gpu);
  const mean = DeviceArray.empty([view.c], "f32", x.gpu);
  const rstd = DeviceArray.empty([view.c], "f32", x.gpu);
  if (view.c === 0) return { y, mean, rstd };
  const update = options.training && options.update;
  const config: BatchNormForwardConfig = {
    dtype: x.dtype,
    out,
    training: options.training,
    update,
    cumulative: update && options.momentum === null,
    weight: t.weight !== null,
    bias: t.bias !== null,
  };
  if (config.cumulative && !t.numBatchesTracked) {
    fail(ValueError, "batchNorm", "momentum null (a cumulative average) needs numBatchesTracked.");
  }
  const tensors = {
    x,
    y,
    mean,
    rstd,
    ...(config.cumulative && { batches: t.numBatchesTracked! }),
    // Bound only where the config reads them (eval) or updates them.
    ...((!config.training || config.update) &&
      { running_mean: t.runningMean, running_var: t.runningVar }),
    ...(t.weight && { w: t.weight }),
    ...(t.bias && { b: t.bias }),
  };
  x.gpu.dispatch(
    x.gpu.kernel(batchNormForwardKernel, config),
    tensors,
    { ...view, ...counts(view), eps: options.eps, momentum: options.momentum ?? 0 },
    grid1d(view.c),
  );
  // Counted after the update read it (one thread, ordered after the statistics).
  if (update && t.numBatchesTracked) {
    x.gpu.dispatch(x.gpu.kernel(countKernel, {}), { batches: t.numBatchesTracked }, {}, [1]);
  }
  return { y, mean, rstd };
}

/**
 * dx (x's dtype) and, where a weight / bias exists, dweight / dbias (f32 [C])
 * from the saved x, mean, rstd and upstream `g` (no autograd).
 */
export function launchBatchNormBackward(
  x: DeviceArray,
  view: BatchNormView,
  saved: { g: DeviceArray; mean: DeviceArray; rstd: DeviceArray; weight: DeviceArray | null },
  options: { training: boolean; bias: boolean },
): { dx: DeviceArray; dw: DeviceArray | null; db: DeviceArray | null } {
  const dx = DeviceArray.empty(x.shape, x.dtype, x.gpu);
  const dw = saved.weight ? DeviceArray.empty([view.c], "f32", x.gpu) : null;
  const db = options.bias ? DeviceArray.empty([view.c], "f32", x.gpu) : null;
  if (view.c === 0) return { dx, dw, db };
  const config: BatchNormBackwardConfig = {
    dtype: x.dtype,
    grad: saved.g.dtype,
    training: options.training,
    update: false,
    cumulative: false,
    weight: dw !== null,
    bias: db !== null,
  };
  const { g, mean, rstd } = saved;
  const tensors = {
    x,
    g,
    mean,
    rstd,
    dx,
    ...(saved.weight && { w: saved.weight }),
    ...(dw && { dw }),
    ...(db && { db }),
  };
  x.gpu.dispatch(
    x.gpu.kernel(batchNormBackwardKernel, config),
    tensors,
    { ...view, ...counts(view), eps: 0, momentum: 0 },
    grid1d(view.c),
  );
  return { dx, dw, db };
}
