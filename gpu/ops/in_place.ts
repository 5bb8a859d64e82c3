/** In-place updates for optimizers and gradient bookkeeping (never recorded on the tape). */
import { ShapeError, StateError } from "../base/errors.ts";
import { isGradEnabled } from "../tensor/autograd.ts";
import { launchAccumulate, launchCopy } from "../kernels/elementwise.ts";
import { sameShape } from "../base/shape.ts";
import { Tensor } from "../tensor/tensor.ts";

/**
 * dst ← beta · dst + alpha · src, in place, with f32 math (dtypes may differ:
 * an f16 or bf16 gradient can be added into an f32 tensor). alpha and beta default to
 * 1 (dst += src). Meant for optimizer updates: call it inside `noGrad()` when
 * `dst` requires grad.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { addInPlace, initGpu, noGrad, sum, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const weight = Tensor.from([1, 2], [2], { requiresGrad: true });
 * sum(weight).backward(); // weight.grad: [1, 1]
 * const lr = 0.5;
 * noGrad(() => addInPlace(weight, weight.grad!, { alpha: -lr })); // plain SGD
 * assert.equal((await weight.read()).join(), "0.5,1.5");
 * gpu.destroy();
 * ```
 */
export function addInPlace(
  dst: Tensor,
  src: Tensor,
  options: { alpha?: number; beta?: number } = {},
): void {
  if (!sameShape(dst.shape, src.shape)) {
    throw new ShapeError(
      `addInPlace: shapes differ (${dst.describe()} += ${src.describe()}); they must match.`,
    );
  }
  if (dst.requiresGrad && isGradEnabled()) {
    throw new StateError(
      `addInPlace: ${dst.describe()} requires grad; an in-place update would silently corrupt ` +
        "the tape. Do optimizer updates inside noGrad().",
    );
  }
  // One buffer cannot be bound read-write and read-only in one dispatch:
  // x += a·x reads a copy.
  const source = src.sharesMemoryWith(dst) ? Tensor.adopt(launchCopy(src)) : src;
  launchAccumulate(dst, source, options.alpha ?? 1, options.beta ?? 1);
  if (source !== src) source.dispose();
}
