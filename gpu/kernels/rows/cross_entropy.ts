/**
 * Cross-entropy from logits with integer class targets, as PyTorch's
 * `cross_entropy(weight, ignore_index, label_smoothing)`, in f32 whatever the
 * logits' dtype. With class weights w (all 1 when none are given), W = Σ_c w_c,
 * ε the smoothing and C the class count, a row r with target t is
 *   loss_r = (1 − ε)·w_t·(lse_r − x[r, t]) + (ε / C)·Σ_c w_c·(lse_r − x[r, c]),
 * and a row whose target is the ignore index has loss 0. The forward keeps,
 * per row, lse_r = m_r + log s_r as its two parts (at |m| ≫ 1 their f32 sum
 * would round log s away: lse − x_t and p would lose it) and the coefficient
 * k_r = (1 − ε)·w_t + (ε / C)·W, so the backward is one elementwise pass
 * with p = exp((x − m) − log s):
 *   dx[r, j] = g_r · (k_r·p[r, j] − (1 − ε)·w_t·[j = t] − (ε / C)·w_j).
 * It also writes w_t per row (0 when ignored): the divisor of the "mean".
 * (1 − ε) and ε / C come from the host, so no WGSL division rounds them.
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
import { ld, ldEntry, rowElement, type RowWidth, st, wgslRowWidth } from "./row_width.ts";
import { REDUCE_THREADS, WGSL_LOWEST, WGSL_MAX_OR_NAN } from "../wgsl/math.ts";

const WORKGROUP = 256;

/** Which variant to compile: the logits' dtype, whether class weights are bound, and the load width. */
export type CrossEntropyConfig = { dtype: DType; weighted: boolean; width: RowWidth };

const UNIFORMS = {
  rows: "u32",
  classes: "u32",
  ignore_index: "i32",
  keep: "f32",
  per_class_smoothing: "f32",
} as const;

/** WGSL for the class weights (a V) of the unit of classes at `unit` (1 without weights). */
function classWeights(c: CrossEntropyConfig, unit: string): string {
  return c.weighted ? `weight[${unit}]` : "V(1.0)";
}

/** WGSL for w_c (an f32) of the single class `index` (1 without weights). */
function classWeight(c: CrossEntropyConfig, index: string): string {
  if (!c.weighted) return "1.0";
  return c.width === 4 ? `weight[(${index}) / 4u][(${index}) % 4u]` : `weight[${index}]`;
}

/** The logits and the optional class weights, bound at the config's width. */
function inputs(c: CrossEntropyConfig) {
  return [
    { name: "x", type: rowElement(c.dtype, c.width) },
    { name: "targets", type: "i32" },
    ...optional(c.weighted, { name: "weight", type: rowElement("f32", c.width) }),
  ] as const;
}

/** Per-row losses, target weights and the (m, log s, k) the backward needs (rows laid out by length). */
export const crossEntropyForwardKernel = defineKernel({
  name: "cross_entropy_forward",
  bindings: (c: CrossEntropyConfig & { layout: RowLayout; lanes: number }) => [
    ...inputs(c),
    { name: "loss", type: "f32", write: true },
    { name: "target_weight", type: "f32", write: true },
    { name: "stats", type: "f32", write: true },
  ],
  uniforms: UNIFORMS,
  source: (c) => {
    const loop = wgslRowLoop(c.layout, "n", c.lanes);
    const x = ld(c.width, "x", "base + j");
    return `${wgslRowReduce(c.layout, c.lanes)}${wgslRowWidth(c.width)}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${wgslRowIndex(c.layout, "rows", c.lanes)}
  let n = p.classes / ${c.width}u;
  let base = row * n;
  var mv = V(${WGSL_LOWEST});
  var wv = V(0.0);
  ${loop} { mv = max(mv, ${x}); wv += ${classWeights(c, "j")}; }
  let m = reduce_max(hmax(mv), lid);
  let w_total = reduce_sum(hsum(wv), lid);
  // Σ w_c·(lse − x_c) = W·(lse − m) + Σ w_c·(m − x_c): two non-negative parts, no cancellation.
  var sv = V(0.0);
  var bv = V(0.0);
  ${loop} {
    let v = ${x};
    sv += exp(v - m);
    bv += ${classWeights(c, "j")} * (m - v);
  }
  let s = reduce_sum(hsum(sv), lid);
  let below_max = reduce_sum(hsum(bv), lid);
  if (${wgslRowLeader(c.layout)} && in_rows) {
    let ls = log(s);
    let t = targets[row];
    let kept = t != p.ignore_index;
    let tc = min(u32(max(t, 0)), p.classes - 1u);
    let w_t = select(0.0, ${classWeight(c, "tc")}, kept);
    let smooth_part = p.per_class_smoothing * (w_total * ls + below_max);
    let x_t = ${ldEntry(c.width, "x", "row * p.classes + tc")};
    loss[row] = select(0.0, p.keep * w_t * ((m - x_t) + ls) + smooth_part, kept);
    target_weight[row] = w_t;
    stats[3u * row] = m;
    stats[3u * row + 1u] = ls;
    stats[3u * row + 2u] = select(0.0, p.keep * w_t + p.per_class_smoothing * w_total, kept);
  }
}`;
  },
});

/**
 * Whether the backward writes bf16 one-entry units as pairs: a thread per
 * u32 word stores both halves at once, where single-entry stores would take
 * two atomics each (rows of odd length share words).
 */
function storesPairs(c: CrossEntropyConfig): boolean {
  return c.dtype === "bf16" && c.width === 1;
}

/**
 * dx from the per-row upstream gradient g (f32 [rows]): a thread per unit (1
 * or 4 classes of one row), or per pair of entries for bf16 rows of one-entry units.
 */
export const crossEntropyBackwardKernel = defineKernel({
  name: "cross_entropy_backward",
  bindings: (c: CrossEntropyConfig) => [
    ...inputs(c),
    { name: "stats", type: "f32" },
    { name: "g", type: "f32" },
    { name: "dx", type: rowElement(c.dtype, c.width), write: true },
  ],
  uniforms: UNIFORMS,
  source: (c) => {
    const columns = c.width === 4 ? "vec4<u32>(j) + vec4<u32>(0u, 1u, 2u, 3u)" : "j";
    const store = storesPairs(c)
      ? `if (2u * i >= units) { return; }
  var second = 0.0;
  if (2u * i + 1u < units) { second = grad_unit(2u * i + 1u); }
  st2_dx(i, vec2<f32>(grad_unit(2u * i), second));`
      : `if (i >= units) { return; }
  ${st(c.width, "dx", "i", "grad_unit(i)")}`;
    return `${WGSL_MAX_OR_NAN}${wgslRowWidth(c.width)}
fn grad_unit(i: u32) -> V {
  let row = (i * ${c.width}u) / p.classes;
  let j = (i * ${c.width}u) % p.classes;
  let t = targets[row];
  let tc = min(u32(max(t, 0)), p.classes - 1u);
  let prob = exp((${ld(c.width, "x", "i")} - stats[3u * row]) - stats[3u * row + 1u]);
  let hit = select(V(0.0), V(p.keep * ${classWeight(c, "tc")}), ${columns} == ${
      c.width === 4 ? "vec4<u32>(tc)" : "tc"
    });
  let d = g[row] * (stats[3u * row + 2u] * prob - hit - p.per_class_smoothing * ${
      classWeights(c, `j / ${c.width}u`)
    });
  return select(V(0.0), d, t != p.ignore_index);
}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  let units = p.rows * p.classes / ${c.width}u;
  ${store}
}`;
  },
});

/** What the cross-entropy kernels need besides the logits and targets. */
export interface CrossEntropyParams {
  /** Class weights, f32 [classes], or null for all ones. */
  weight: DeviceArray | null;
  /** The target id whose rows count for nothing. */
  ignoreIndex: number;
  /** Label smoothing ε in [0, 1]. */
  smoothing: number;
}

function launchConfig(logits: DeviceArray, params: CrossEntropyParams) {
  const [rows, classes] = logits.shape;
  const width = rowPlan(logits.gpu, classes).width;
  const config = { dtype: logits.dtype, weighted: params.weight !== null, width };
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

/** Numbers each row keeps for the backward: its maximum m, log s and k. */
export const CROSS_ENTROPY_STATS_PER_ROW = 3;

/** Per-row results of {@link launchCrossEntropy}, all f32. */
export interface CrossEntropyRows {
  /** Loss of each row [rows]. */
  loss: DeviceArray;
  /** w_t of each row, 0 where ignored [rows]. */
  targetWeight: DeviceArray;
  /** m, log s and k of each row [rows, 3] (lse = m + log s), for the backward. */
  stats: DeviceArray;
}

/** Per-row losses for logits [rows, classes]. No autograd. */
export function launchCrossEntropy(
  logits: DeviceArray,
  targets: DeviceArray,
  params: CrossEntropyParams,
): CrossEntropyRows {
  const { rows, classes, config, uniforms, weight } = launchConfig(logits, params);
  const { layout, lanes } = rowPlan(logits.gpu, classes);
  const loss = DeviceArray.empty([rows], "f32", logits.gpu);
  const targetWeight = DeviceArray.empty([rows], "f32", logits.gpu);
  const stats = DeviceArray.empty([rows, CROSS_ENTROPY_STATS_PER_ROW], "f32", logits.gpu);
  if (rows === 0) return { loss, targetWeight, stats };
  logits.gpu.dispatch(
    logits.gpu.kernel(crossEntropyForwardKernel, { ...config, layout, lanes }),
    { x: logits, targets, ...weight, loss, target_weight: targetWeight, stats },
    uniforms,
    rowGrid({ layout, lanes }, rows),
  );
  return { loss, targetWeight, stats };
}

/** The logits' gradient from per-row gradients `g` (f32 [rows]). No autograd. */
export function launchCrossEntropyBackward(
  logits: DeviceArray,
  targets: DeviceArray,
  stats: DeviceArray,
  g: DeviceArray,
  params: CrossEntropyParams,
): DeviceArray {
  const { rows, classes, config, uniforms, weight } = launchConfig(logits, params);
  const dx = DeviceArray.empty(logits.shape, logits.dtype, logits.gpu);
  if (rows * classes === 0) return dx;
  logits.gpu.dispatch(
    logits.gpu.kernel(crossEntropyBackwardKernel, config),
    { x: logits, targets, ...weight, stats, g, dx },
    uniforms,
    grid1d(Math.ceil((rows * classes) / (storesPairs(config) ? 2 : config.width) / WORKGROUP)),
  );
  return dx;
}
