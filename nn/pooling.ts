/**
 * Pooling and flatten layers (NCHW, as PyTorch). They have no parameters;
 * their options are checked in the constructor, not at the first forward.
 */
import {
  adaptiveAvgPool2d,
  type AdaptiveSize2d,
  avgPool2d,
  type AvgPool2dOptions,
  checkFlattenDims,
  flatten,
  maxPool2d,
  type MaxPool2dOptions,
  resolveAdaptiveSize,
  resolvePool2dOptions,
  type Size2d,
  type Tensor,
} from "../gpu/mod.ts";
import { Module } from "./module.ts";

/** `{ kernelSize: k }` for a bare size, else the options themselves. */
function optionsOf<O extends { kernelSize: Size2d }>(arg: Size2d | O): O {
  return typeof arg === "number" || Array.isArray(arg)
    ? { kernelSize: arg as Size2d } as O
    : arg as O;
}

/**
 * 2-D max pooling (see {@link maxPool2d}), as `torch.nn.MaxPool2d`. Give
 * the kernel size alone (`new MaxPool2d(2)`) or every option
 * (`new MaxPool2d({ kernelSize: 3, stride: 2, padding: 1, ceilMode: true })`).
 * For the indices of the picked elements, call `maxPool2d` with
 * `returnIndices`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, MaxPool2d, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const pool = new MaxPool2d(2);
 * const x = Tensor.from([1, 2, 5, 3, 4, 0, 7, 1, 9, 8, 2, 6, 3, 3, 1, 2], [1, 1, 4, 4]);
 * const y = pool.forward(x); // [1, 1, 2, 2]
 * assert.equal((await y.read()).join(), "4,7,9,6");
 * gpu.destroy();
 * ```
 */
export class MaxPool2d extends Module {
  /** Window [height, width]. */
  readonly kernelSize: readonly [number, number];
  /** Step between windows [y, x]. */
  readonly stride: readonly [number, number];
  /** Implicit −∞ padding [y, x]. */
  readonly padding: readonly [number, number];
  /** Spacing between taps [y, x]. */
  readonly dilation: readonly [number, number];
  /** Whether the output size rounds up. */
  readonly ceilMode: boolean;

  /** A max-pooling layer; throws a ValueError at once for invalid options. */
  constructor(options: Size2d | MaxPool2dOptions) {
    super();
    const o = resolvePool2dOptions("MaxPool2d", optionsOf(options), "max");
    this.kernelSize = o.kernelSize;
    this.stride = o.stride;
    this.padding = o.padding;
    this.dilation = o.dilation;
    this.ceilMode = o.ceilMode;
  }

  /** Max-pools `x` ([N, C, H, W] or [C, H, W]). */
  forward(x: Tensor): Tensor {
    return maxPool2d(x, {
      kernelSize: this.kernelSize,
      stride: this.stride,
      padding: this.padding,
      dilation: this.dilation,
      ceilMode: this.ceilMode,
    });
  }
}

/**
 * 2-D average pooling (see {@link avgPool2d}), as `torch.nn.AvgPool2d`.
 * Give the kernel size alone (`new AvgPool2d(2)`) or every option.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AvgPool2d, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const pool = new AvgPool2d({ kernelSize: 2, stride: 1 });
 * const y = pool.forward(Tensor.from([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 1, 3, 3]));
 * assert.equal((await y.read()).join(), "3,4,6,7");
 * gpu.destroy();
 * ```
 */
export class AvgPool2d extends Module {
  /** Window [height, width]. */
  readonly kernelSize: readonly [number, number];
  /** Step between windows [y, x]. */
  readonly stride: readonly [number, number];
  /** Implicit zero padding [y, x]. */
  readonly padding: readonly [number, number];
  /** Whether padding counts in the divisor. */
  readonly countIncludePad: boolean;
  /** Whether the output size rounds up. */
  readonly ceilMode: boolean;
  /** The divisor of every window, or null (see `countIncludePad`). */
  readonly divisorOverride: number | null;

  /** An average-pooling layer; throws a ValueError at once for invalid options. */
  constructor(options: Size2d | AvgPool2dOptions) {
    super();
    const o = resolvePool2dOptions("AvgPool2d", optionsOf(options), "avg");
    this.kernelSize = o.kernelSize;
    this.stride = o.stride;
    this.padding = o.padding;
    this.countIncludePad = o.countIncludePad;
    this.ceilMode = o.ceilMode;
    this.divisorOverride = o.divisorOverride;
  }

  /** Average-pools `x` ([N, C, H, W] or [C, H, W]). */
  forward(x: Tensor): Tensor {
    return avgPool2d(x, {
      kernelSize: this.kernelSize,
      stride: this.stride,
      padding: this.padding,
      countIncludePad: this.countIncludePad,
      ceilMode: this.ceilMode,
      divisorOverride: this.divisorOverride,
    });
  }
}

/**
 * Adaptive average pooling to a fixed output size (see
 * {@link adaptiveAvgPool2d}), as `torch.nn.AdaptiveAvgPool2d`;
 * `new AdaptiveAvgPool2d(1)` is global average pooling.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AdaptiveAvgPool2d, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const gap = new AdaptiveAvgPool2d(1);
 * const y = gap.forward(Tensor.from([1, 2, 3, 4, 10, 20, 30, 40], [1, 2, 2, 2]));
 * assert.equal(y.shape.join(), "1,2,1,1");
 * assert.equal((await y.read()).join(), "2.5,25");
 * gpu.destroy();
 * ```
 */
export class AdaptiveAvgPool2d extends Module {
  /** Output [height, width]; null keeps the input's size along that axis. */
  readonly outputSize: readonly [number | null, number | null];

  /** An adaptive average-pooling layer; throws a ValueError at once for an invalid size. */
  constructor(outputSize: AdaptiveSize2d) {
    super();
    this.outputSize = resolveAdaptiveSize("AdaptiveAvgPool2d", outputSize);
  }

  /** Pools `x` ([N, C, H, W] or [C, H, W]) to the output size. */
  forward(x: Tensor): Tensor {
    return adaptiveAvgPool2d(x, this.outputSize);
  }
}

/**
 * Merges axes `startDim` … `endDim` into one (see {@link flatten}), as
 * `torch.nn.Flatten`: by default [N, C, H, W] → [N, C·H·W], a view without
 * a copy.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { Flatten, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const y = new Flatten().forward(Tensor.zeros([2, 3, 4, 5]));
 * assert.equal(y.shape.join(), "2,60");
 * gpu.destroy();
 * ```
 */
export class Flatten extends Module {
  /** First axis merged (negative counts from the end). */
  readonly startDim: number;
  /** Last axis merged, inclusive (negative counts from the end). */
  readonly endDim: number;

  /** A flatten layer; throws a ValueError at once unless both axes are integers. */
  constructor(startDim = 1, endDim = -1) {
    super();
    checkFlattenDims("Flatten", startDim, endDim);
    this.startDim = startDim;
    this.endDim = endDim;
  }

  /** Flattens `x`. */
  forward(x: Tensor): Tensor {
    return flatten(x, this.startDim, this.endDim);
  }
}
