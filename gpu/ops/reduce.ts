/** Differentiable reductions: sum and mean over one axis or all; max (no gradient). */
import { isGradEnabled, record } from "../tensor/autograd.ts";
import { autocastInputs, autocastInputsWidenedInKernel } from "../tensor/autocast_hook.ts";
import { fail, ShapeError, StateError, ValueError } from "../base/errors.ts";
import { shortValue } from "../base/short_text.ts";
import { assertTensors } from "./checks.ts";
import { launchUnary } from "../kernels/elementwise.ts";
import { launchReduce, type ReduceOp, type ReduceView } from "../kernels/reduce.ts";
import { normalizeAxis, type Shape, sizeOf } from "../base/shape.ts";
import { Tensor } from "../tensor/tensor.ts";

/** Options of the reductions. */
export interface ReduceOptions {
  /** The axis to reduce (negative counts from the end); all axes when omitted. */
  axis?: number;
  /** Keep the reduced axis with extent 1 (default false). */
  keepDims?: boolean;
}

function plan(op: string, x: Tensor, options: ReduceOptions): { view: ReduceView; shape: Shape } {
  assertTensors(op, x);
  if (typeof options !== "object" || options === null) {
    fail(
      ValueError,
      op,
      `options must be an object such as { axis: 1 }, got ${shortValue(options)}.`,
    );
  }
  if (options.axis === undefined) {
    return {
      view: { outer: 1, axis: x.size, inner: 1 },
      shape: options.keepDims ? x.shape.map(() => 1) : [],
    };
  }
  const axis = normalizeAxis(op, options.axis, x.rank);
  const view = {
    outer: sizeOf(x.shape.slice(0, axis)),
    axis: x.shape[axis],
    inner: sizeOf(x.shape.slice(axis + 1)),
  };
  const shape = options.keepDims
    ? x.shape.map((d, i) => (i === axis ? 1 : d))
    : x.shape.filter((_, i) => i !== axis);
  return { view, shape };
}

function reduceWithGrad(op: "sum" | "mean", x0: Tensor, options: ReduceOptions): Tensor {
  // The kernel sums in f32 whatever it reads: f16 or bf16 input is not cast up first under autocast.
  const { inputs: [x], widened } = autocastInputsWidenedInKernel(op, [x0]);
  const out = widened ? "f32" : x.dtype;
  const { view, shape } = plan(op, x, options);
  const scale = op === "mean" ? 1 / Math.max(view.axis, 1) : 1;
  // The mean of nothing is NaN, as in PyTorch (the sum of nothing is 0). WGSL
  // may assume no NaN arises, so it is written from the host, not computed.
  const y = op === "mean" && view.axis === 0
    ? Tensor.full(shape, NaN, { dtype: out === "i32" ? "f32" : out, gpu: x.gpu })
    : Tensor.adopt(launchReduce("sum", x, view, shape, { scale, out }));
  // The gradient repeats along the reduced axis (times 1/n for a mean).
  return record({
    op,
    inputs: [x],
    output: y,
    backward: (g) => [
      Tensor.adopt(launchUnary("scale", g, {
        scalar: scale,
        out: x.dtype,
        expand: { shape: x.shape, broadcast: { mid: view.axis, inner: view.inner } },
      })),
    ],
  });
}

/**
 * Sum over `options.axis`, or of every element. Accumulates in f32; the
 * result has the input's dtype.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, sum, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2, 3, 4, 5, 6], [2, 3]);
 * const total = sum(x); // shape []
 * const perRow = sum(x, { axis: -1 }); // [M, N] -> [M]
 * assert.equal(await total.item(), 21);
 * assert.equal((await perRow.read()).join(), "6,15");
 * gpu.destroy();
 * ```
 */
export function sum(x: Tensor, options: ReduceOptions = {}): Tensor {
  return reduceWithGrad("sum", x, options);
}

/**
 * Mean over `options.axis`, or of every element (f32 accumulation). The mean
 * of nothing (an empty axis, an empty batch) is NaN, as in PyTorch.
 */
export function mean(x: Tensor, options: ReduceOptions = {}): Tensor {
  return reduceWithGrad("mean", x, options);
}

/** Maximum over `options.axis`, or of every element. Has no gradient: use it under `noGrad`. */
export function max(x0: Tensor, options: ReduceOptions = {}): Tensor {
  const [x] = autocastInputs("max", [x0]);
  if (isGradEnabled() && x.requiresGrad) {
    fail(
      StateError,
      "max",
      `input ${x.describe()} requires grad but max has no gradient rule; ` +
        "call it inside noGrad() (e.g. for metrics).",
    );
  }
  const { view, shape } = plan("max", x, options);
  if (view.axis === 0 && view.outer * view.inner > 0) {
    fail(
      ShapeError,
      "max",
      `${x.describe()} has no elements along the reduced axis; the max of nothing is ` +
        "undefined (PyTorch raises too). Check for an empty batch first.",
    );
  }
  return Tensor.adopt(launchReduce("max" satisfies ReduceOp, x, view, shape));
}
