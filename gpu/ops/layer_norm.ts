/**
 * Differentiable LayerNorm over the last axis: fused forward and backward
 * kernels, f32 statistics and f32 affine parameters whatever x's dtype.
 */
import { DTypeError, ShapeError, ValueError } from "../base/errors.ts";
import { record } from "../tensor/autograd.ts";
import { autocastInputs } from "../tensor/autocast_hook.ts";
import {
  launchLayerNorm,
  launchLayerNormBackward,
  launchLayerNormParamGrads,
} from "../kernels/rows/layer_norm.ts";
import { sameShape, shapeString } from "../base/shape.ts";
import { Tensor } from "../tensor/tensor.ts";

/** Options of {@link layerNorm}. */
export interface LayerNormOptions {
  /** Scale, f32 [C] (default none: 1). */
  weight?: Tensor | null;
  /** Shift, f32 [C] (default none: 0). */
  bias?: Tensor | null;
  /** Added to the variance before the square root (default 1e-5, as PyTorch). */
  eps?: number;
}

function checkParameter(name: string, p: Tensor | null, x: Tensor, cols: number): void {
  if (p === null) return;
  if (p.dtype !== "f32" || !sameShape(p.shape, [cols])) {
    throw new DTypeError(
      `layerNorm: ${name} must be f32 ${shapeString([cols])} (LayerNorm keeps its affine ` +
        `parameters in fp32; the size is the last axis of the input) for input ${x.describe()}, ` +
        `got ${p.describe()}. Create it with Tensor.from(..., [${cols}], { dtype: "f32" }).`,
    );
  }
  if (p.gpu !== x.gpu) {
    throw new ValueError(
      `layerNorm: ${name} ${p.describe()} and input ${x.describe()} are on ` +
        "different devices.",
    );
  }
}

/** Checks layerNorm's input, parameters and eps; returns the size of the normalised axis. */
export function checkLayerNormInputs(
  x: Tensor,
  weight: Tensor | null,
  bias: Tensor | null,
  eps: number,
): number {
  if (x.dtype === "i32") {
    throw new DTypeError(`layerNorm: input ${x.describe()} must be f32, f16 or bf16.`);
  }
  if (x.rank === 0) {
    throw new ShapeError(
      `layerNorm: input ${x.describe()} is a scalar; it needs at least one axis to normalise.`,
    );
  }
  if (!(eps >= 0) || !Number.isFinite(eps)) {
    throw new ValueError(`layerNorm: eps must be a finite number ≥ 0, got ${eps}.`);
  }
  const cols = x.shape[x.rank - 1];
  checkParameter("weight", weight, x, cols);
  checkParameter("bias", bias, x, cols);
  return cols;
}

/**
 * LayerNorm over the last axis (size C): y = (x − mean) / √(var + eps) · weight + bias,
 * with the mean and biased variance of each row computed in f32. `x` is f32,
 * f16 or bf16 and y has its dtype; `weight` and `bias` are f32 [C] or null (no affine
 * term). Gradients: dx in x's dtype, dweight and dbias in f32.
 *
 * Saved for backward: x (a shared handle, no copy), the per-row mean and rstd
 * (f32 [rows]) and the weight. They are freed once the backward rule has run,
 * or when the graph is dropped.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, layerNorm, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const data = [1, 2, 3, 4, 5, 5, 5, 5];
 * const x = Tensor.from(data, [1, 2, 4], { dtype: "f16" }); // [batch, tokens, 4]
 * const w = Tensor.full([4], 1, { requiresGrad: true });
 * const b = Tensor.zeros([4], { requiresGrad: true });
 * const y = layerNorm(x, { weight: w, bias: b }); // y: f16, same shape
 * assert.equal(y.dtype, "f16");
 * assert.equal((await y.read())[4], 0); // a constant row → 0
 * gpu.destroy();
 * ```
 */
export function layerNorm(x0: Tensor, options: LayerNormOptions = {}): Tensor {
  // Only the activation is autocast: the affine parameters stay fp32.
  const [x] = autocastInputs("layer_norm", [x0]);
  const eps = options.eps ?? 1e-5;
  const weight = options.weight ?? null, bias = options.bias ?? null;
  checkLayerNormInputs(x, weight, bias, eps);
  const launched = launchLayerNorm(x, weight, bias, eps);
  const [y, mean, rstd] = [launched.y, launched.mean, launched.rstd].map(Tensor.adopt);
  const inputs = [x, ...(weight ? [weight] : []), ...(bias ? [bias] : [])];
  const needDx = x.requiresGrad;
  const want = { weight: weight?.requiresGrad ?? false, bias: bias?.requiresGrad ?? false };
  const saved = [x, mean, rstd, ...(weight ? [weight] : [])];
  try {
    return record({
      op: "layer_norm",
      inputs,
      output: y,
      save: saved,
      backward: (g, [sx, sMean, sRstd, sWeight]) => {
        const dx = needDx
          ? Tensor.adopt(launchLayerNormBackward(sx, sWeight ?? null, g, sMean, sRstd))
          : null;
        const { dw, db } = launchLayerNormParamGrads(sx, g, sMean, sRstd, want);
        const params = [...(weight ? [dw] : []), ...(bias ? [db] : [])];
        return [dx, ...params.map((t) => t && Tensor.adopt(t))];
      },
    });
  } finally {
    // record() keeps its own shared handles of what it saves; ours go now, so
    // the statistics live exactly as long as the tape node (or not at all).
    mean.dispose();
    rstd.dispose();
  }
}
