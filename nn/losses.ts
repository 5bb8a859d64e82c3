/** Loss functions. Both compute in f32 and return an f32 loss whatever the input dtype. */
import {
  assertTensors,
  broadcastInto,
  cast,
  type CrossEntropyPerRow,
  crossEntropyPerRow,
  div,
  fail,
  type LinearCrossEntropyOptions,
  linearCrossEntropyPerRow,
  mean,
  noteCaptureCheck,
  sameShape,
  shortValue,
  square,
  sub,
  sum,
  Tensor,
  ValueError,
  warnOnce,
} from "../gpu/mod.ts";

/** How per-element losses are combined. */
export type Reduction = "mean" | "sum" | "none";

/** Options of {@link crossEntropy}; each named as its PyTorch counterpart says. */
export interface CrossEntropyOptions {
  /** "mean" (default), "sum" or "none" (per-row losses); PyTorch's `reduction`. */
  reduction?: Reduction;
  /** Label smoothing ε in [0, 1] (default 0); PyTorch's `label_smoothing`. */
  labelSmoothing?: number;
  /**
   * Per-class weights [classes] (PyTorch's `weight`): host numbers or an f32
   * tensor. With weights, "mean" divides by the summed weights of the kept
   * rows' targets, as PyTorch does.
   */
  weight?: Tensor | ArrayLike<number>;
  /** Rows with this target add nothing to the loss or gradient (default −100); PyTorch's `ignore_index`. */
  ignoreIndex?: number;
}

/** The reduction option, checked (default "mean"). */
function checkReduction(op: string, reduction: unknown = "mean"): Reduction {
  if (reduction !== "mean" && reduction !== "sum" && reduction !== "none") {
    fail(
      ValueError,
      op,
      `reduction must be "mean", "sum" or "none", not ${shortValue(reduction)}.`,
    );
  }
  return reduction;
}

function reduce(losses: Tensor, reduction: Reduction): Tensor {
  if (reduction === "none") return losses;
  const out = reduction === "mean" ? mean(losses) : sum(losses);
  losses.dispose();
  return out;
}

/**
 * Whether some row may be ignored, judged from the targets' host-known range
 * (a captured step asks again for each new batch's targets).
 */
function mayIgnore(ids: Tensor, ignoreIndex: number): boolean {
  const may = (range = ids.indexRange) =>
    range === null || (ignoreIndex >= range.min && ignoreIndex <= range.max);
  const recorded = may();
  noteCaptureCheck(() =>
    may() === recorded
      ? null
      : `whether the targets may hold the ignore index ${ignoreIndex} changed`
  );
  return recorded;
}

/** Σ losses / Σ target weights: PyTorch's "mean" with weights or ignored rows (NaN when all are ignored). */
function weightedMean(losses: Tensor, targetWeights: Tensor): Tensor {
  const total = sum(losses);
  const count = sum(targetWeights);
  const out = div(total, count);
  total.dispose();
  count.dispose();
  return out;
}

/** Host numbers uploaded as a tensor on `gpu`, or the tensor itself. */
function uploaded(
  values: Tensor | ArrayLike<number>,
  dtype: "f32" | "i32",
  gpu: Tensor["gpu"],
): Tensor {
  return values instanceof Tensor ? values : Tensor.from(values, [values.length], { dtype, gpu });
}

/** The class ids as an i32 tensor (host numbers uploaded), or a clear error. */
function idsOf(op: string, targets: Tensor | ArrayLike<number>, gpu: Tensor["gpu"]): Tensor {
  if (!(targets instanceof Tensor) && typeof targets?.length !== "number") {
    fail(
      ValueError,
      op,
      `targets must be an i32 tensor or an array of class ids, got ${shortValue(targets)}.`,
    );
  }
  return uploaded(targets, "i32", gpu);
}

/**
 * Cross-entropy from logits [rows, classes] against integer class ids
 * (`targets`: an i32 tensor, or host numbers uploaded here), as
 * `torch.nn.functional.cross_entropy`: class weights, an ignore index
 * (−100 by default) and label smoothing. Ids outside [0, classes) other
 * than the ignore index are a clear error. Log-sum-exp in f32.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { crossEntropy, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const logits = Tensor.zeros([3, 4]); // e.g. model.forward(x): [rows, classes]
 * const loss = crossEntropy(logits, [3, 1, -100], { labelSmoothing: 0.1 }); // row 2 ignored
 * const value = await loss.item();
 * assert.ok(Math.abs(value - Math.log(4)) < 1e-5, `loss ${value}`); // uniform: ln 4
 * gpu.destroy();
 * ```
 */
export function crossEntropy(
  logits: Tensor,
  targets: Tensor | ArrayLike<number>,
  options: CrossEntropyOptions = {},
): Tensor {
  assertTensors("crossEntropy", logits);
  const reduction = checkReduction("crossEntropy", options.reduction);
  const ignoreIndex = options.ignoreIndex ?? -100;
  const ids = idsOf("crossEntropy", targets, logits.gpu);
  const weight = options.weight === undefined
    ? undefined
    : uploaded(options.weight, "f32", logits.gpu);
  try {
    const rows = crossEntropyPerRow(logits, ids, {
      weight,
      ignoreIndex,
      smoothing: options.labelSmoothing ?? 0,
    });
    return reduceRows(rows, reduction, weight !== undefined || mayIgnore(ids, ignoreIndex));
  } finally {
    if (ids !== targets) ids.dispose();
    if (weight !== options.weight) weight?.dispose();
  }
}

/**
 * Per-row losses reduced as PyTorch's cross-entropy does: "mean" divides by
 * the summed target weights where rows may be weighted or ignored, by the
 * row count otherwise. Takes ownership of both tensors.
 */
function reduceRows(rows: CrossEntropyPerRow, reduction: Reduction, weighted: boolean): Tensor {
  const { losses, targetWeights } = rows;
  if (reduction === "mean" && weighted) {
    const out = weightedMean(losses, targetWeights);
    losses.dispose();
    targetWeights.dispose();
    return out;
  }
  targetWeights.dispose();
  return reduce(losses, reduction);
}

/** Options of {@link linearCrossEntropy}. */
export interface LinearCrossEntropyLossOptions extends LinearCrossEntropyOptions {
  /** "mean" (default), "sum" or "none" (per-row losses). */
  reduction?: Reduction;
}

/**
 * `crossEntropy(linear(h, weight), targets)` without ever holding the whole
 * logits [rows, classes]: the head's product and the cross-entropy run on
 * chunks of rows (`chunkRows`), and backward recomputes each chunk's logits
 * (see `linearCrossEntropyPerRow`). For a language model's head at a large
 * vocabulary, where the logits and their gradient are a step's largest
 * tensors. h [rows, features], weight [classes, features] (a Linear's or a
 * tied embedding's), targets as for {@link crossEntropy}; the ignore index
 * and the reductions are PyTorch's. h and the weight may be lists of pieces
 * along the features (a table kept in column pieces, each within one buffer).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, linearCrossEntropy, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const h = Tensor.from([1, 2, 3, 4, 5, 6], [3, 2]); // the final LayerNorm's rows
 * const table = Tensor.zeros([4, 2], { requiresGrad: true }); // tied head: 4 tokens
 * const loss = linearCrossEntropy(h, table, [3, 1, -100], { chunkRows: 2 }); // row 2 ignored
 * const value = await loss.item();
 * assert.ok(Math.abs(value - Math.log(4)) < 1e-5, `${value}`); // uniform: ln 4
 * loss.backward(); // table.grad: [4, 2]
 * gpu.destroy();
 * ```
 */
export function linearCrossEntropy(
  h: Tensor | readonly Tensor[],
  weight: Tensor | readonly Tensor[],
  targets: Tensor | ArrayLike<number>,
  options: LinearCrossEntropyLossOptions = {},
): Tensor {
  const pieces = [h, weight].flat() as Tensor[];
  assertTensors("linearCrossEntropy", ...pieces);
  const reduction = checkReduction("linearCrossEntropy", options.reduction);
  const ignoreIndex = options.ignoreIndex ?? -100;
  const ids = idsOf("linearCrossEntropy", targets, pieces[0].gpu);
  try {
    const rows = linearCrossEntropyPerRow(h, weight, ids, {
      ignoreIndex,
      chunkRows: options.chunkRows,
    });
    return reduceRows(rows, reduction, mayIgnore(ids, ignoreIndex));
  } finally {
    if (ids !== targets) ids.dispose();
  }
}

/**
 * Mean squared error between `input` and `target` (same shape), in f32.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, mseLoss, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const prediction = Tensor.from([1, 2, 3], [3]), y = Tensor.from([1, 2, 6], [3]);
 * const loss = mseLoss(prediction, y); // (0 + 0 + 9) / 3
 * const value = await loss.item();
 * assert.ok(Math.abs(value - 3) < 1e-6, `loss ${value}`);
 * gpu.destroy();
 * ```
 */
export function mseLoss(
  input: Tensor,
  target: Tensor,
  options: { reduction?: Reduction } = {},
): Tensor {
  assertTensors("mseLoss", input, target);
  const reduction = checkReduction("mseLoss", options.reduction);
  if (!sameShape(input.shape, target.shape)) {
    // As PyTorch: a target that broadcasts into the input is used, with a warning (it is
    // usually a mistake); one that does not is a ShapeError named as mseLoss.
    broadcastInto("mseLoss", input.shape, target.shape);
    warnOnce(
      `mseLoss: target ${target.describe()} differs from input ${input.describe()} and is ` +
        "broadcast, as PyTorch does; this is usually a mistake (reshape the target).",
    );
  }
  const a = input.dtype === "f32" ? input : cast(input, "f32");
  const b = target.dtype === "f32" ? target : cast(target, "f32");
  const diff = sub(a, b);
  const losses = square(diff);
  diff.dispose();
  if (a !== input) a.dispose();
  if (b !== target) b.dispose();
  return reduce(losses, reduction);
}
