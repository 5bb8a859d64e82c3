/** Differentiable 2-D convolution, NCHW, as PyTorch's `conv2d`. */
import { record } from "../tensor/autograd.ts";
import { autocastInputs, releaseCasts } from "../tensor/autocast_hook.ts";
import { weightGradTarget } from "./linear.ts";
import type { MatmulTiling } from "../kernels/gemm/settings.ts";
import { DTypeError, fail, ShapeError, ValueError } from "../base/errors.ts";
import { launchBinary } from "../kernels/elementwise.ts";
import {
  type Conv2dGeometry,
  conv2dProblems,
  launchConv2d,
  launchConv2dBiasGrad,
  launchConv2dInputGrad,
  launchConv2dWeightGrad,
} from "../kernels/gemm/conv2d.ts";
import { tilingFor } from "../kernels/gemm/matmul_class.ts";
import { gradDtypeOf, Tensor } from "../tensor/tensor.ts";
import { assertSameDtype, assertSameGpu } from "./checks.ts";
import { pairOf, type Size2d } from "./size2d.ts";

export type { Size2d };

/** Options of {@link conv2d}; each as in `torch.nn.functional.conv2d`. */
export interface Conv2dOptions {
  /** Bias [O], f32 or x's dtype (default none). */
  bias?: Tensor | null;
  /** Step between output positions (default 1). */
  stride?: Size2d;
  /**
   * Zeros added on each side (default 0); `"same"` keeps H and W (stride 1
   * only; an odd total goes one more to the bottom/right, as PyTorch);
   * `"valid"` is 0.
   */
  padding?: Size2d | "same" | "valid";
  /** Spacing between kernel taps (default 1). */
  dilation?: Size2d;
  /** Channel groups: C and O both divide by it; groups = C is depthwise (default 1). */
  groups?: number;
  /** ReLU fused into the epilogue (default `"none"`), as {@link linear}'s. */
  activation?: "none" | "relu";
}

/** The geometry of conv2d(x, weight, options), or a clear error. */
export function conv2dGeometry(x: Tensor, weight: Tensor, options: Conv2dOptions): Conv2dGeometry {
  const shapes = `input ${x.describe()}, weight ${weight.describe()}`;
  if (x.rank !== 4) {
    fail(
      ShapeError,
      "conv2d",
      `input must be [N, C, H, W] (got ${shapes}); add a batch axis with reshape.`,
    );
  }
  if (weight.rank !== 4) {
    fail(ShapeError, "conv2d", `weight must be [O, C/groups, KH, KW] (got ${shapes}).`);
  }
  if (x.dtype === "i32") {
    fail(DTypeError, "conv2d", `input and weight must be f32, f16 or bf16 (got ${shapes}).`);
  }
  const groups = options.groups ?? 1;
  if (!Number.isInteger(groups) || groups < 1) {
    fail(ValueError, "conv2d", `groups must be a positive integer, got ${groups}.`);
  }
  const [batch, inChannels, inH, inW] = x.shape;
  const [outChannels, perGroup, kH, kW] = weight.shape;
  if (inChannels % groups !== 0 || outChannels % groups !== 0) {
    fail(
      ShapeError,
      "conv2d",
      `input channels ${inChannels} and output channels ${outChannels} must both divide by ` +
        `groups ${groups} (${shapes}).`,
    );
  }
  if (perGroup !== inChannels / groups) {
    fail(
      ShapeError,
      "conv2d",
      `weight has ${perGroup} input channels per group but the input gives ` +
        `${inChannels} / ${groups} groups = ${inChannels / groups} (${shapes}).`,
    );
  }
  const problems: string[] = [];
  const [strideH, strideW] = pairOf("stride", options.stride ?? 1, 1, problems);
  const [dilationH, dilationW] = pairOf("dilation", options.dilation ?? 1, 1, problems);
  const padding = options.padding ?? 0;
  const explicit = padding === "same" || padding === "valid" ? 0 : padding;
  const [padH0, padW0] = pairOf("padding", explicit, 0, problems);
  fail(ValueError, "conv2d", problems);
  const spanH = dilationH * (kH - 1) + 1, spanW = dilationW * (kW - 1) + 1;
  let padH: number, padW: number, outH: number, outW: number;
  if (padding === "same") {
    if (strideH !== 1 || strideW !== 1) {
      fail(
        ValueError,
        "conv2d",
        `padding "same" needs stride 1, got stride [${strideH}, ${strideW}].`,
      );
    }
    // The left/top side gets the smaller half, as PyTorch.
    [padH, padW, outH, outW] = [Math.floor((spanH - 1) / 2), Math.floor((spanW - 1) / 2), inH, inW];
  } else {
    [padH, padW] = [padH0, padW0];
    outH = Math.floor((inH + 2 * padH - spanH) / strideH) + 1;
    outW = Math.floor((inW + 2 * padW - spanW) / strideW) + 1;
    if (inH + 2 * padH < spanH || inW + 2 * padW < spanW) {
      fail(
        ShapeError,
        "conv2d",
        `the kernel spans ${spanH}×${spanW} (dilation included) but the padded input is ` +
          `${inH + 2 * padH}×${inW + 2 * padW} (${shapes}, padding [${padH}, ${padW}]): ` +
          "pad more or use a smaller kernel.",
      );
    }
  }
  return {
    batch,
    inChannels,
    inH,
    inW,
    outChannels,
    outH,
    outW,
    kH,
    kW,
    strideH,
    strideW,
    padH,
    padW,
    dilationH,
    dilationW,
    groups,
  };
}

/** The tuned matmul tiling of a GEMM of this size (the class of x·Wᵀ, as a linear layer). */
function tilingOf(
  t: Tensor,
  size: { m: number; n: number; k: number },
  groups: number,
): MatmulTiling {
  const { m, n, k } = size;
  const strided = {
    batch: groups,
    m,
    n,
    k,
    a: { batch: m * k, row: k, col: 1 },
    b: { batch: 0, row: 1, col: k },
  };
  return tilingFor(t.gpu, strided, t.dtype);
}

/**
 * 2-D convolution of `x` [N, C, H, W] with `weight` [O, C/groups, KH, KW]
 * (PyTorch's layouts): stride, padding (numbers, pairs, `"same"`,
 * `"valid"`), dilation, groups (depthwise when groups = C), an optional bias
 * and a fused ReLU. f32, f16 or bf16 storage, f32 accumulation; f16 (or
 * bf16) under autocast (it is on the f16 list). Implicit GEMM: the unfolded input is gathered inside the kernel and
 * never stored; backward computes dx, dweight and dbias the same way.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { conv2d, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 1, 3, 3]); // [N, C, H, W]
 * const w = Tensor.from([1, 0, 0, -1], [1, 1, 2, 2]); // [O, C, KH, KW]
 * const y = conv2d(x, w, { padding: 0 }); // x[i, j] − x[i + 1, j + 1]
 * assert.equal((await y.read()).join(), "-4,-4,-4,-4");
 * assert.equal(y.shape.join(), "1,1,2,2");
 * gpu.destroy();
 * ```
 */
export function conv2d(x0: Tensor, weight0: Tensor, options: Conv2dOptions = {}): Tensor {
  const [x, weight] = autocastInputs("conv2d", [x0, weight0]);
  assertSameGpu("conv2d", x, weight);
  assertSameDtype("conv2d", x, weight);
  const g = conv2dGeometry(x, weight, options);
  const bias = options.bias ?? null;
  if (bias && (bias.rank !== 1 || bias.shape[0] !== g.outChannels)) {
    fail(
      ShapeError,
      "conv2d",
      `bias ${bias.describe()} must be [${g.outChannels}] (one per output channel).`,
    );
  }
  if (bias && bias.dtype !== "f32" && bias.dtype !== x.dtype) {
    fail(DTypeError, "conv2d", `bias ${bias.describe()} must be f32 or the input's ${x.dtype}.`);
  }
  const activation = options.activation ?? "none";
  if (activation !== "none" && activation !== "relu") {
    fail(
      ValueError,
      "conv2d",
      `activation must be "none" or "relu", not ${JSON.stringify(activation)}.`,
    );
  }
  const relu = activation === "relu";
  const problems = conv2dProblems(g);
  const y = Tensor.adopt(launchConv2d(x, weight, g, tilingOf(x, problems.forward, g.groups), {
    bias: bias ?? undefined,
    relu,
  }));
  // The weight gradient goes to an f32 weight in f32 (see weightGradTarget).
  const gradTarget = weightGradTarget(weight0, weight);
  const inputs = bias ? [x, gradTarget, bias] : [x, gradTarget];
  const out = record({
    op: "conv2d",
    inputs,
    output: y,
    save: relu ? [x, weight, y] : [x, weight],
    backward: (dy0, [sx, sw, sy], needs) => {
      // ReLU's gradient from its output: y > 0 exactly where the pre-activation is.
      const dy = relu ? Tensor.adopt(launchBinary("relu_grad", dy0, sy)) : dy0;
      const dx = needs[0]
        ? Tensor.adopt(launchConv2dInputGrad(dy, sw, g, tilingOf(dy, problems.inputGrad, g.groups)))
        : null;
      const dw = needs[1]
        ? Tensor.adopt(
          launchConv2dWeightGrad(
            dy,
            sx,
            g,
            tilingOf(dy, problems.weightGrad, 1),
            gradDtypeOf(gradTarget),
          ),
        )
        : null;
      const db = bias && needs[2] ? Tensor.adopt(launchConv2dBiasGrad(dy, g, bias.dtype)) : null;
      if (dy !== dy0) dy.dispose();
      return (bias ? [dx, dw, db] : [dx, dw]).map((t) => t && Tensor.adopt(t));
    },
  });
  return releaseCasts([weight], out);
}
