/** In-place updates for optimizers and gradient bookkeeping (never recorded on the tape). */
import { DTypeError, fail, ShapeError, StateError } from "../base/errors.ts";
import { isGradEnabled } from "../tensor/autograd.ts";
import { launchAccumulateInto, launchCopy } from "../kernels/elementwise.ts";
import { launchNarrowInto } from "../kernels/narrow.ts";
import { normalizeAxis, sameShape } from "../base/shape.ts";
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
  launchAccumulateInto(dst, source, options.alpha ?? 1, options.beta ?? 1);
  if (source !== src) source.dispose();
}

/**
 * Copies `src` into indices `start .. start + src.shape[axis]` of `dst` along
 * `axis`, in place (PyTorch's `dst.narrow(axis, start, n).copy_(src)`): src
 * has dst's shape except along `axis`, and its dtype. Not recorded on the
 * tape (call it inside `noGrad()` when `dst` requires grad), like
 * {@link addInPlace}. For bf16 the window must start and end on even element
 * offsets (two elements share a word).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { copyInto, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const cache = Tensor.zeros([2, 3]); // e.g. a key cache: [rows, positions]
 * copyInto(cache, Tensor.from([7, 8], [2, 1]), { axis: 1, start: 2 });
 * assert.deepEqual([...await cache.read()], [0, 0, 7, 0, 0, 8]);
 * gpu.destroy();
 * ```
 */
export function copyInto(dst: Tensor, src: Tensor, window: { axis: number; start: number }): void {
  const where = "copyInto";
  const axis = normalizeAxis(where, window.axis, dst.rank);
  const length = src.shape[axis];
  const fits = src.rank === dst.rank &&
    src.shape.every((e, a) => a === axis || e === dst.shape[a]) &&
    Number.isInteger(window.start) && window.start >= 0 &&
    window.start + length <= dst.shape[axis];
  if (!fits) {
    fail(
      ShapeError,
      where,
      `src ${src.describe()} does not fit dst ${dst.describe()} at ${window.start} along axis ` +
        `${window.axis}: the shapes must agree except along it, and start + length must be ` +
        `at most ${dst.shape[axis]}.`,
    );
  }
  if (src.dtype !== dst.dtype) {
    fail(DTypeError, where, `src ${src.describe()} and dst ${dst.describe()} differ in dtype.`);
  }
  if (dst.requiresGrad && isGradEnabled()) {
    fail(StateError, where, `dst ${dst.describe()} requires grad; copy inside noGrad().`);
  }
  const source = src.sharesMemoryWith(dst) ? Tensor.adopt(launchCopy(src)) : src;
  const written = launchNarrowInto(dst, source, { axis, start: window.start, length });
  if (source !== src) source.dispose();
  if (!written) {
    fail(
      ShapeError,
      where,
      `a bf16 window of ${src.describe()} at ${window.start} along axis ${window.axis} of ` +
        `${dst.describe()} does not start and end on whole words (two bf16 a word).`,
    );
  }
}
