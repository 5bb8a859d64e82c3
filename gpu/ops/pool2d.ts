/**
 * Differentiable 2-D pooling in NCHW layout (PyTorch's): max pooling, average
 * pooling and adaptive average pooling over the last two axes of an
 * [N, C, H, W] (or unbatched [C, H, W]) tensor. f32, f16 or bf16 in, the same dtype
 * out, f32 arithmetic inside. The backward rules gather per input element, so
 * overlapping windows add up without atomics (see gpu/kernels/pool2d.ts).
 */
import { isGradEnabled, record } from "../tensor/autograd.ts";
import { autocastInputs, releaseCasts } from "../tensor/autocast_hook.ts";
import { DTypeError, fail, ShapeError, ValueError } from "../base/errors.ts";
import {
  launchAdaptiveAvgPool2d,
  launchAdaptiveAvgPool2dBackward,
  launchAvgPool2d,
  launchAvgPool2dBackward,
  launchMaxPool2d,
  launchMaxPool2dBackward,
  type Pool2dGeometry,
} from "../kernels/pool2d.ts";
import { shapeString, sizeOf } from "../base/shape.ts";
import { shortValue } from "../base/short_text.ts";
import { Tensor } from "../tensor/tensor.ts";
import { pairOf, type Size2d } from "./size2d.ts";

export type { Size2d };

/** Options of {@link maxPool2d} (PyTorch's `max_pool2d` arguments). */
export interface MaxPool2dOptions {
  /** Window size (required). */
  kernelSize: Size2d;
  /** Step between windows (default: the kernel size). */
  stride?: Size2d | null;
  /** Implicit −∞ padding on each side, at most half the kernel size (default 0). */
  padding?: Size2d;
  /** Spacing between window taps (default 1). */
  dilation?: Size2d;
  /**
   * Round the output size up, not down (default false): a last window that
   * overhangs the input is kept when it starts inside the input or the left
   * padding, as PyTorch's `ceil_mode`.
   */
  ceilMode?: boolean;
}

/**
 * {@link maxPool2d}'s options with PyTorch's `return_indices`: true also
 * returns the i32 flat index (row · W + col within its [H, W] plane) of the
 * element each output picked.
 */
export interface MaxPool2dIndicesOptions extends MaxPool2dOptions {
  /** Return `[values, indices]` (true) or the values alone (false, the default). */
  returnIndices?: boolean;
}

/** Options of {@link avgPool2d} (PyTorch's `avg_pool2d` arguments). */
export interface AvgPool2dOptions {
  /** Window size (required). */
  kernelSize: Size2d;
  /** Step between windows (default: the kernel size). */
  stride?: Size2d | null;
  /** Implicit zero padding on each side, at most half the kernel size (default 0). */
  padding?: Size2d;
  /**
   * Divide by the window area, padding included (default true, as PyTorch;
   * with `ceilMode`, the part of a last window past the padding does not
   * count); false: by the number of input elements in the window.
   */
  countIncludePad?: boolean;
  /** Round the output size up, not down (default false), as PyTorch's `ceil_mode`. */
  ceilMode?: boolean;
  /** Divide every window's sum by this nonzero integer instead (PyTorch's `divisor_override`). */
  divisorOverride?: number | null;
}

/** Pooling options with every field present and every size a [height, width] pair. */
export interface ResolvedPool2dOptions {
  /** Window size. */
  readonly kernelSize: readonly [number, number];
  /** Step between windows. */
  readonly stride: readonly [number, number];
  /** Padding on each side. */
  readonly padding: readonly [number, number];
  /** Spacing between taps ([1, 1] for average pooling). */
  readonly dilation: readonly [number, number];
  /** Average pooling: whether padding counts in the divisor (true for max pooling). */
  readonly countIncludePad: boolean;
  /** Whether the output size rounds up. */
  readonly ceilMode: boolean;
  /** Average pooling: the divisor of every window, or null (max pooling: null). */
  readonly divisorOverride: number | null;
}

/** An adaptive pooling output size: one number for both axes, or [height, width] (null: keep the input's). */
export type AdaptiveSize2d = number | readonly [number | null, number | null];

/**
 * Checks pooling options without an input and returns them resolved (what
 * {@link maxPool2d} and {@link avgPool2d} do first, and what the nn layers
 * call in their constructors). `where` names the caller in errors; `kind`
 * says which options apply. Throws a ValueError listing every problem.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { resolvePool2dOptions } from "./pool2d.ts";
 * const o = resolvePool2dOptions("maxPool2d", { kernelSize: [3, 1], padding: [1, 0] }, "max");
 * assert.equal(o.stride.join(), "3,1");
 * assert.equal(o.dilation.join(), "1,1");
 * ```
 */
export function resolvePool2dOptions(
  where: string,
  options: MaxPool2dOptions | AvgPool2dOptions,
  kind: "max" | "avg",
): ResolvedPool2dOptions {
  if (typeof options !== "object" || options === null) {
    fail(
      ValueError,
      where,
      `options must be an object such as { kernelSize: 2 }, got ${JSON.stringify(options)}.`,
    );
  }
  const problems: string[] = [];
  const kernelSize = pairOf("kernelSize", options.kernelSize, 1, problems);
  const stride = options.stride === undefined || options.stride === null
    ? kernelSize
    : pairOf("stride", options.stride, 1, problems);
  const padding = pairOf("padding", options.padding ?? 0, 0, problems);
  const dilation = kind === "max"
    ? pairOf("dilation", (options as MaxPool2dOptions).dilation ?? 1, 1, problems)
    : [1, 1] as [number, number];
  const countIncludePad = kind === "avg"
    ? (options as AvgPool2dOptions).countIncludePad ?? true
    : true;
  const ceilMode = options.ceilMode ?? false;
  for (const [name, flag] of [["countIncludePad", countIncludePad], ["ceilMode", ceilMode]]) {
    if (typeof flag !== "boolean") {
      problems.push(`${name} must be true or false, got ${shortValue(flag)}`);
    }
  }
  const divisorOverride = kind === "avg"
    ? (options as AvgPool2dOptions).divisorOverride ?? null
    : null;
  if (
    divisorOverride !== null &&
    !(Number.isInteger(divisorOverride) && divisorOverride !== 0 &&
      Math.abs(divisorOverride) < 2 ** 31)
  ) {
    problems.push(
      `divisorOverride must be a nonzero integer or null, got ${shortValue(divisorOverride)}`,
    );
  }
  if (
    problems.length === 0 && (padding[0] > kernelSize[0] >> 1 || padding[1] > kernelSize[1] >> 1)
  ) {
    problems.push(
      `padding ${shapeString(padding)} must be at most half of the kernel size ` +
        `${shapeString(kernelSize)} (PyTorch: "pad should be at most half of kernel size"); ` +
        "use less padding or a larger kernel",
    );
  }
  fail(ValueError, where, problems);
  return { kernelSize, stride, padding, dilation, countIncludePad, ceilMode, divisorOverride };
}

/**
 * Checks an adaptive pooling output size without an input and returns it as a
 * pair (null entries stay null: the input's size along that axis).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { resolveAdaptiveSize } from "./pool2d.ts";
 * assert.equal(resolveAdaptiveSize("adaptiveAvgPool2d", 1).join(), "1,1");
 * ```
 */
export function resolveAdaptiveSize(
  where: string,
  outputSize: AdaptiveSize2d,
): readonly [number | null, number | null] {
  const ok = (v: unknown) => v === null || (Number.isInteger(v) && (v as number) >= 1);
  if (typeof outputSize === "number" && ok(outputSize)) return [outputSize, outputSize];
  if (
    Array.isArray(outputSize) && outputSize.length === 2 && ok(outputSize[0]) &&
    ok(outputSize[1])
  ) {
    return [outputSize[0], outputSize[1]];
  }
  fail(
    ValueError,
    where,
    "outputSize must be a positive integer or a pair [height, width] of positive integers " +
      `(or null: the input's size), got ${JSON.stringify(outputSize)}.`,
  );
}

/** Checks x's rank and dtype; returns [planes, H, W]. */
function planesOf(where: string, x: Tensor): [number, number, number] {
  if (x.dtype === "i32") {
    fail(
      DTypeError,
      where,
      `input ${x.describe()} must be f32, f16 or bf16; cast it with cast(x, "f32") first.`,
    );
  }
  if (x.rank !== 3 && x.rank !== 4) {
    fail(
      ShapeError,
      where,
      `input ${x.describe()} must be [N, C, H, W] or unbatched [C, H, W] (NCHW layout); ` +
        "reshape it (e.g. add a channel axis) first.",
    );
  }
  const [h, w] = x.shape.slice(-2);
  return [sizeOf(x.shape.slice(0, -2)), h, w];
}

function windowGeometry(where: string, x: Tensor, o: ResolvedPool2dOptions): Pool2dGeometry {
  const [planes, h, w] = planesOf(where, x);
  const out = (size: number, axis: 0 | 1) => {
    const span = o.dilation[axis] * (o.kernelSize[axis] - 1) + 1, s = o.stride[axis];
    const p = o.padding[axis], last = size + 2 * p - span;
    const n = Math.floor((o.ceilMode ? last + s - 1 : last) / s) + 1;
    // PyTorch's ceil mode: the last window must start inside the input or the left padding.
    return o.ceilMode && (n - 1) * s >= size + p ? n - 1 : n;
  };
  const oh = out(h, 0), ow = out(w, 1);
  if (oh < 1 || ow < 1) {
    const dilated = o.dilation[0] !== 1 || o.dilation[1] !== 1
      ? ` and dilation ${shapeString(o.dilation)}`
      : "";
    fail(
      ShapeError,
      where,
      `input ${x.describe()} is too small for kernel ${shapeString(o.kernelSize)} with ` +
        `padding ${shapeString(o.padding)}${dilated}: the output would be ` +
        `${shapeString([oh, ow])}. Use a smaller kernel, more padding or a larger input.`,
    );
  }
  return {
    inputShape: x.shape,
    outputShape: [...x.shape.slice(0, -2), oh, ow],
    planes,
    h,
    w,
    oh,
    ow,
    kernel: o.kernelSize,
    stride: o.stride,
    padding: o.padding,
    dilation: o.dilation,
  };
}

/**
 * 2-D max pooling over the last two axes of x ([N, C, H, W] or [C, H, W]),
 * as `torch.nn.functional.max_pool2d`: the output is
 * [..., ⌊(H + 2p − d(k − 1) − 1)/s⌋ + 1, same for W] (rounded up with
 * `ceilMode`), padding counts as −∞. A window holding NaN gives NaN. Each
 * output picks, as PyTorch does, the first maximum in row-major window
 * order, or the last NaN if any; its gradient goes to that element
 * (overlapping windows add up). With `returnIndices` it returns
 * `[values, indices]`: i32 flat indices row · W + col into each [H, W] input
 * plane, PyTorch's `return_indices` (−1 for a window of padding only, which
 * dilation allows; PyTorch gives an index outside the window there).
 *
 * Saved for backward: the i32 indices (only when x requires grad).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, maxPool2d, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2, 5, 3, 4, 0, 7, 1, 9, 8, 2, 6, 3, 3, 1, 2], [1, 1, 4, 4]);
 * const y = maxPool2d(x, { kernelSize: 2 }); // [1, 1, 2, 2]: the max of each 2×2 block
 * assert.equal((await y.read()).join(), "4,7,9,6");
 * const [z, at] = maxPool2d(x, { kernelSize: 3, stride: 2, ceilMode: true, returnIndices: true });
 * assert.equal(z.shape.join(), "1,1,2,2");
 * assert.equal((await at.read()).join(), "8,6,8,11");
 * gpu.destroy();
 * ```
 */
export function maxPool2d(
  x: Tensor,
  options: MaxPool2dIndicesOptions & { returnIndices: true },
): [Tensor, Tensor];
/** Max pooling's values alone (see the first signature). */
export function maxPool2d(
  x: Tensor,
  options: MaxPool2dOptions | MaxPool2dIndicesOptions & { returnIndices?: false },
): Tensor;
/** Max pooling with `returnIndices` known only at run time (see the first signature). */
export function maxPool2d(x: Tensor, options: MaxPool2dIndicesOptions): Tensor | [Tensor, Tensor];
export function maxPool2d(
  x0: Tensor,
  options: MaxPool2dIndicesOptions,
): Tensor | [Tensor, Tensor] {
  const o = resolvePool2dOptions("maxPool2d", options, "max");
  const returnIndices = options.returnIndices ?? false;
  if (typeof returnIndices !== "boolean") {
    fail(
      ValueError,
      "maxPool2d",
      `returnIndices must be true or false, got ${shortValue(returnIndices)}.`,
    );
  }
  const [x] = autocastInputs("max_pool2d", [x0]);
  const geo = windowGeometry("maxPool2d", x, o);
  const recording = isGradEnabled() && x.requiresGrad;
  const launched = launchMaxPool2d(x, geo, recording || returnIndices);
  const y = Tensor.adopt(launched.y);
  const indices = launched.indices && Tensor.adopt(launched.indices);
  if (!recording) {
    releaseCasts([x], y); // nothing would be recorded
    return returnIndices ? [y, indices!] : y;
  }
  try {
    const out = record({
      op: "max_pool2d",
      inputs: [x],
      output: y,
      save: [indices!],
      backward: (g, [saved]) => [Tensor.adopt(launchMaxPool2dBackward(g, saved, geo))],
    });
    return returnIndices ? [out, indices!] : out;
  } finally {
    // record() holds its own handle while the node lives; the caller's is returned.
    if (!returnIndices) indices!.dispose();
  }
}

/**
 * 2-D average pooling over the last two axes of x ([N, C, H, W] or
 * [C, H, W]), as `torch.nn.functional.avg_pool2d`: output size
 * ⌊(H + 2p − k)/s⌋ + 1 (rounded up with `ceilMode`), zero padding, divisor
 * kh·kw when `countIncludePad` (the default; with `ceilMode`, a last window
 * counts only the part inside input and padding), else the number of input
 * elements in the window, or `divisorOverride` for every window. Sums run in
 * f32. The backward sends g / divisor to every input
 * element of each window (overlapping windows add up); nothing is saved.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { avgPool2d, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 1, 3, 3]);
 * const y = avgPool2d(x, { kernelSize: 2, stride: 1 }); // [1, 1, 2, 2]
 * assert.equal((await y.read()).join(), "3,4,6,7");
 * const z = avgPool2d(x, { kernelSize: 3, padding: 1, countIncludePad: false }); // [1, 1, 1, 1]
 * assert.equal((await z.read())[0], 3); // (1 + 2 + 4 + 5) / 4 input elements
 * gpu.destroy();
 * ```
 */
export function avgPool2d(x0: Tensor, options: AvgPool2dOptions): Tensor {
  const o = resolvePool2dOptions("avgPool2d", options, "avg");
  const [x] = autocastInputs("avg_pool2d", [x0]);
  const geo = windowGeometry("avgPool2d", x, o);
  const y = Tensor.adopt(launchAvgPool2d(x, geo, o));
  return record({
    op: "avg_pool2d",
    inputs: [x],
    output: y,
    backward: (g) => [Tensor.adopt(launchAvgPool2dBackward(g, geo, o))],
  });
}

/**
 * Adaptive average pooling of the last two axes of x ([N, C, H, W] or
 * [C, H, W]) to `outputSize` ([oh, ow], or one number for both; null keeps
 * the input's size), as `torch.nn.functional.adaptive_avg_pool2d`: output
 * row i averages input rows ⌊i·H/oh⌋ … ⌈(i+1)·H/oh⌉ − 1 (likewise columns),
 * so windows may overlap or differ in size. `outputSize` 1 is global average
 * pooling. The backward spreads each g over its window; nothing is saved.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { adaptiveAvgPool2d, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2, 3, 4, 10, 20, 30, 40], [1, 2, 2, 2]); // [N, C, H, W]
 * const y = adaptiveAvgPool2d(x, 1); // global average pooling: [1, 2, 1, 1]
 * assert.equal(y.shape.join(), "1,2,1,1");
 * assert.equal((await y.read()).join(), "2.5,25");
 * gpu.destroy();
 * ```
 */
export function adaptiveAvgPool2d(x0: Tensor, outputSize: AdaptiveSize2d): Tensor {
  const size = resolveAdaptiveSize("adaptiveAvgPool2d", outputSize);
  const [x] = autocastInputs("adaptive_avg_pool2d", [x0]);
  const [planes, h, w] = planesOf("adaptiveAvgPool2d", x);
  const oh = size[0] ?? h, ow = size[1] ?? w;
  if (h < 1 || w < 1) {
    fail(
      ShapeError,
      "adaptiveAvgPool2d",
      `input ${x.describe()} has an empty spatial axis; H and W must be at least 1.`,
    );
  }
  const one = [1, 1] as const, zero = [0, 0] as const;
  const geo: Pool2dGeometry = {
    inputShape: x.shape,
    outputShape: [...x.shape.slice(0, -2), oh, ow],
    planes,
    h,
    w,
    oh,
    ow,
    kernel: one,
    stride: one,
    padding: zero,
    dilation: one,
  };
  const y = Tensor.adopt(launchAdaptiveAvgPool2d(x, geo));
  return record({
    op: "adaptive_avg_pool2d",
    inputs: [x],
    output: y,
    backward: (g) => [Tensor.adopt(launchAdaptiveAvgPool2dBackward(g, geo))],
  });
}
