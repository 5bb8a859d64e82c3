/**
 * A language model's head and its cross-entropy as one op that never holds
 * the whole logits (Liger-Kernel's fused linear cross-entropy): at a large
 * vocabulary the logits [rows, V] and their gradient are a step's largest
 * tensors (GPT-2 at batch 8 × 512 tokens: 823 MB each in f32).
 *
 * Forward, for each chunk of rows: the chunk's logits h·Wᵀ, their log-sum-exp
 * and the losses (the cross-entropy kernels), then the logits are dropped.
 * Kept for backward: h, W (the tape's handles of tensors that live anyway)
 * and two f32 numbers per row (the log-sum-exp and the target's coefficient).
 * Backward, for each chunk: the logits again, softmax − one-hot scaled by the
 * upstream gradient (the cross-entropy backward kernel), then dh = dlogits·W
 * (written into its rows of dh) and dW += dlogitsᵀ·h. At most one chunk's
 * logits and their gradient are alive, plus one chunk's dW before it is added.
 * One op with one gradient rule: the extra cost is the logits' product run
 * again in backward.
 */
import { record } from "../autograd.ts";
import { autocastInputs, releaseCasts } from "../autocast_hook.ts";
import { DTypeError, fail, ShapeError, ValueError } from "../errors.ts";
import {
  type CrossEntropyParams,
  launchCrossEntropy,
  launchCrossEntropyBackward,
} from "../kernels/cross_entropy.ts";
import { launchAccumulate, launchUnary } from "../kernels/elementwise.ts";
import { launchNarrow, launchNarrowInto } from "../kernels/narrow.ts";
import { Tensor } from "../tensor.ts";
import { assertTensors } from "./checks.ts";
import type { CrossEntropyPerRow } from "./cross_entropy.ts";
import { assertIdsInRange } from "./ids_check.ts";
import { weightGradTarget } from "./linear.ts";
import { product } from "./matmul.ts";

/** Logit elements per chunk by default: 2^23 (32 MiB in f32, 16 MiB in f16). */
export const LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS = 2 ** 23;

/** Options of {@link linearCrossEntropyPerRow}. */
export interface LinearCrossEntropyOptions {
  /** Rows whose target is this id add nothing (PyTorch's `ignore_index`, default −100). */
  ignoreIndex?: number;
  /**
   * Rows per chunk (default: as many as keep a chunk's logits within
   * {@link LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS}). Memory falls with it; the
   * number of dispatches grows.
   */
  chunkRows?: number;
}

/** Rows [start, start + length) of `x` (no copy when they are all of it). */
function rowsOf(x: Tensor, start: number, length: number): Tensor {
  return length === x.shape[0] ? x.share() : launchNarrow(x, { axis: 0, start, length });
}

/** Writes `src` at row `start` of `dst` (no autograd). */
function placeRows(dst: Tensor, src: Tensor, start: number): void {
  if (!launchNarrowInto(dst, src, { axis: 0, start, length: src.shape[0] })) {
    throw new Error("linearCrossEntropy: rows of odd bf16 length cannot be placed"); // f32 only here
  }
}

function checked(h: Tensor, w: Tensor, targets: Tensor, options: LinearCrossEntropyOptions) {
  const where = "linearCrossEntropy";
  if (h.rank !== 2 || w.rank !== 2 || h.shape[1] !== w.shape[1]) {
    fail(
      ShapeError,
      where,
      `needs h [rows, features] and weight [classes, features] (a Linear's layout); got h ` +
        `${h.describe()} and weight ${w.describe()}.`,
    );
  }
  if (h.dtype === "i32" || w.dtype !== h.dtype) {
    fail(
      DTypeError,
      where,
      `h ${h.describe()} and weight ${w.describe()} must share one float dtype (or run under autocast).`,
    );
  }
  if (targets.dtype !== "i32" || targets.rank !== 1 || targets.shape[0] !== h.shape[0]) {
    fail(ShapeError, where, `targets must be i32 [${h.shape[0]}], got ${targets.describe()}.`);
  }
  const ignoreIndex = options.ignoreIndex ?? -100;
  if (!Number.isInteger(ignoreIndex) || Math.abs(ignoreIndex) >= 2 ** 31) {
    fail(ValueError, where, `ignoreIndex must be a 32-bit integer, got ${ignoreIndex}.`);
  }
  const classes = w.shape[0];
  const chunk = options.chunkRows ??
    Math.max(1, Math.floor(LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS / Math.max(classes, 1)));
  if (!Number.isInteger(chunk) || chunk < 1) {
    fail(ValueError, where, `chunkRows must be an integer >= 1, got ${options.chunkRows}.`);
  }
  assertIdsInRange(where, targets, classes, ignoreIndex);
  const params: CrossEntropyParams = { weight: null, ignoreIndex, smoothing: 0 };
  return { params, chunk };
}

/**
 * The cross-entropy of `linear(h, weight)` against `targets`, row by row, as
 * `crossEntropyPerRow(linear(h, weight), targets)` gives it (within f32
 * rounding: the products run on chunks of rows), without ever holding all
 * the logits: h [rows, features], weight [classes, features] (PyTorch's
 * Linear layout, e.g. a tied embedding table), i32 targets [rows]. Gradients
 * flow to h and the weight. Under autocast (`"linear_cross_entropy"`, on the
 * f16 list) the products run in f16 or bf16 as a linear layer's would, the
 * cross-entropy in f32, and the weight's gradient is written in f32 into an
 * f32 master's.
 *
 * @example
 * ```ts
 * import { initGpu, linearCrossEntropyPerRow, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const h = Tensor.from([1, 0, 0, 1, 1, 1], [3, 2], { requiresGrad: true }); // hidden rows
 * const w = Tensor.zeros([5, 2]); // 5 classes: all logits 0
 * const targets = Tensor.from([4, 0, 2], [3], { dtype: "i32" });
 * const { losses } = linearCrossEntropyPerRow(h, w, targets, { chunkRows: 2 });
 * const values = await losses.read();
 * console.assert(values.every((l) => Math.abs(l - Math.log(5)) < 1e-6)); // uniform: ln 5
 * gpu.destroy();
 * ```
 */
export function linearCrossEntropyPerRow(
  h0: Tensor,
  weight0: Tensor,
  targets: Tensor,
  options: LinearCrossEntropyOptions = {},
): CrossEntropyPerRow {
  assertTensors("linearCrossEntropy", h0, weight0, targets);
  const [h, w] = autocastInputs("linear_cross_entropy", [h0, weight0]);
  const { params, chunk } = checked(h, w, targets, options);
  // An f32 input cast down for the products gets its gradient in f32, straight from them.
  const hTarget = weightGradTarget(h0, h), wTarget = weightGradTarget(weight0, w);
  const rows = h.shape[0];
  const whole = rows <= chunk;
  const loss = whole ? null : Tensor.empty([rows], "f32", h.gpu);
  const targetWeight = whole ? null : Tensor.empty([rows], "f32", h.gpu);
  const stats = whole ? null : Tensor.empty([rows, 2], "f32", h.gpu);
  let out: ReturnType<typeof launchCrossEntropy> | null = null;
  for (let start = 0; start < rows; start += chunk) {
    const n = Math.min(chunk, rows - start);
    const hc = rowsOf(h, start, n), tc = rowsOf(targets, start, n);
    const logits = product(hc, w, false, true);
    const part = launchCrossEntropy(logits, tc, params);
    for (const t of [hc, tc, logits]) t.dispose();
    if (whole) {
      out = part;
      break;
    }
    placeRows(loss!, part.loss, start);
    placeRows(targetWeight!, part.targetWeight, start);
    placeRows(stats!, part.stats, start);
    for (const t of [part.loss, part.targetWeight, part.stats]) t.dispose();
  }
  out ??= { loss: loss!, targetWeight: targetWeight!, stats: stats! };
  const losses = record({
    op: "linear_cross_entropy",
    inputs: [hTarget, wTarget],
    output: out.loss,
    save: [h, w, targets, out.stats],
    backward: (g, [sh, sw, st, ss], needs) =>
      linearCrossEntropyBackward(g, { h: sh, w: sw, targets: st, stats: ss }, {
        params,
        chunk,
        needs,
        dtypes: [hTarget.dtype, wTarget.dtype],
      }),
  });
  out.stats.dispose(); // the tape holds its own handle
  releaseCasts([h, w], losses);
  return { losses, targetWeights: out.targetWeight };
}

/** dh and dW from the per-row gradient `g` (f32 [rows]), chunk by chunk. */
function linearCrossEntropyBackward(
  g: Tensor,
  saved: { h: Tensor; w: Tensor; targets: Tensor; stats: Tensor },
  how: {
    params: CrossEntropyParams;
    chunk: number;
    needs: readonly boolean[];
    dtypes: [Tensor["dtype"], Tensor["dtype"]];
  },
): (Tensor | null)[] {
  const { h, w, targets, stats } = saved, { chunk, needs } = how;
  const [rows, features] = h.shape;
  const whole = rows <= chunk;
  // dh is written chunk by chunk in f32 (rows placed whole), then cast once if h is narrower.
  let dh = needs[0] && !whole ? Tensor.empty([rows, features], "f32", h.gpu) : null;
  let dw: Tensor | null = null;
  for (let start = 0; start < rows; start += chunk) {
    const n = Math.min(chunk, rows - start);
    const [hc, tc, sc, gc] = [h, targets, stats, g].map((t) => rowsOf(t, start, n));
    const logits = product(hc, w, false, true);
    const dlogits = launchCrossEntropyBackward(logits, tc, sc, gc, how.params);
    logits.dispose();
    if (needs[0]) {
      const part = product(dlogits, w, false, false, "f32");
      if (whole) dh = part;
      else {
        placeRows(dh!, part, start);
        part.dispose();
      }
    }
    if (needs[1]) {
      const part = product(dlogits, hc, true, false, how.dtypes[1]);
      if (dw === null) dw = part;
      else {
        launchAccumulate(dw, part, 1, 1);
        part.dispose();
      }
    }
    for (const t of [hc, tc, sc, gc, dlogits]) t.dispose();
  }
  if (dh && dh.dtype !== how.dtypes[0]) {
    const cast = launchUnary("identity", dh, { out: how.dtypes[0] });
    dh.dispose();
    dh = cast;
  }
  return [dh, dw];
}
