/** Loss functions. Both compute in f32 and return an f32 loss whatever the input dtype. */
import { crossEntropyPerRow } from "../gpu/ops/cross_entropy.ts";
import { cast, square, sub } from "../gpu/ops/elementwise.ts";
import { mean, sum } from "../gpu/ops/reduce.ts";
import { Tensor } from "../gpu/tensor.ts";

/** How per-element losses are combined. */
export type Reduction = "mean" | "sum" | "none";

/** Options of {@link crossEntropy}. */
export interface CrossEntropyOptions {
  /** "mean" (default), "sum" or "none" (per-row losses). */
  reduction?: Reduction;
  /** Label smoothing ε in [0, 1) (default 0). */
  labelSmoothing?: number;
}

function reduce(losses: Tensor, reduction: Reduction): Tensor {
  if (reduction === "none") return losses;
  const out = reduction === "mean" ? mean(losses) : sum(losses);
  losses.dispose();
  return out;
}

/**
 * Cross-entropy from logits [rows, classes] against integer class ids
 * (`targets`: an i32 tensor, or host numbers uploaded here). Ids outside
 * [0, classes) are a clear error. Log-sum-exp in f32; optional label
 * smoothing as in PyTorch.
 *
 * @example
 * ```ts
 * import { crossEntropy, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const logits = Tensor.zeros([3, 4]); // e.g. model.forward(x): [rows, classes]
 * const loss = crossEntropy(logits, [3, 1, 0], { labelSmoothing: 0.1 });
 * console.assert(Math.abs((await loss.item()) - Math.log(4)) < 1e-5); // uniform: ln 4
 * gpu.destroy();
 * ```
 */
export function crossEntropy(
  logits: Tensor,
  targets: Tensor | ArrayLike<number>,
  options: CrossEntropyOptions = {},
): Tensor {
  const ids = targets instanceof Tensor
    ? targets
    : Tensor.from(targets, [targets.length], { dtype: "i32", gpu: logits.gpu });
  try {
    const losses = crossEntropyPerRow(logits, ids, options.labelSmoothing ?? 0);
    return reduce(losses, options.reduction ?? "mean");
  } finally {
    if (ids !== targets) ids.dispose();
  }
}

/**
 * Mean squared error between `input` and `target` (same shape), in f32.
 *
 * @example
 * ```ts
 * import { initGpu, mseLoss, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const prediction = Tensor.from([1, 2, 3], [3]), y = Tensor.from([1, 2, 6], [3]);
 * const loss = mseLoss(prediction, y); // (0 + 0 + 9) / 3
 * console.assert(Math.abs((await loss.item()) - 3) < 1e-6);
 * gpu.destroy();
 * ```
 */
export function mseLoss(
  input: Tensor,
  target: Tensor,
  options: { reduction?: Reduction } = {},
): Tensor {
  const a = input.dtype === "f32" ? input : cast(input, "f32");
  const b = target.dtype === "f32" ? target : cast(target, "f32");
  const diff = sub(a, b);
  const losses = square(diff);
  diff.dispose();
  if (a !== input) a.dispose();
  if (b !== target) b.dispose();
  return reduce(losses, options.reduction ?? "mean");
}
