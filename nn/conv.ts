/** The 2-D convolution layer. */
import { conv2d, type Conv2dOptions, type Size2d, type Tensor, ValueError } from "../gpu/mod.ts";
import { generatorOf, type ParameterOptions, uniformTensor } from "./init.ts";
import { Module } from "./module.ts";

/** Options of {@link Conv2d}; each named and defaulted as in `torch.nn.Conv2d`. */
export interface Conv2dLayerOptions extends ParameterOptions {
  /** Step between output positions (default 1). */
  stride?: Size2d;
  /** Zeros on each side (default 0), or `"same"` (stride 1) / `"valid"`. */
  padding?: Size2d | "same" | "valid";
  /** Spacing between kernel taps (default 1). */
  dilation?: Size2d;
  /** Channel groups (default 1; `groups: inChannels` is a depthwise convolution). */
  groups?: number;
  /** Add a bias (default true). */
  bias?: boolean;
  /** Fuse a ReLU into the kernel's epilogue (default "none"). */
  activation?: "none" | "relu";
}

/**
 * y = conv2d(x, W) + b over x [N, C, H, W], with W [O, C/groups, KH, KW]
 * (PyTorch's layout, so state dicts load into `torch.nn.Conv2d`),
 * initialised as PyTorch does: W and b uniform in ±1/√(C/groups·KH·KW),
 * from a seeded generator. Runs in f16 under autocast (f32 accumulation).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { Conv2d, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const conv = new Conv2d(1, 4, 3, { padding: 1, seed: 1 });
 * const y = conv.forward(Tensor.zeros([2, 1, 28, 28])); // [N, C, H, W] → [N, 4, 28, 28]
 * assert.equal(y.shape.join(), "2,4,28,28");
 * gpu.destroy();
 * ```
 */
export class Conv2d extends Module {
  /** Weight [out, in/groups, KH, KW]. */
  readonly weight: Tensor;
  /** Bias [out], or null. */
  readonly bias: Tensor | null;
  /** The convolution's options (stride, padding, dilation, groups, activation). */
  readonly options: Readonly<Omit<Conv2dOptions, "bias">>;

  /** A layer from `inChannels` to `outChannels` with a `kernelSize` kernel (a number or [KH, KW]). */
  constructor(
    inChannels: number,
    outChannels: number,
    kernelSize: Size2d,
    options: Conv2dLayerOptions = {},
  ) {
    super();
    const groups = options.groups ?? 1;
    const [kh, kw] = typeof kernelSize === "number" ? [kernelSize, kernelSize] : kernelSize;
    const positive = (v: number) => Number.isInteger(v) && v > 0;
    if (![inChannels, outChannels, kh, kw, groups].every(positive)) {
      throw new ValueError(
        `Conv2d: channels, kernel size and groups must be positive integers, got ` +
          `${inChannels} → ${outChannels}, kernel ${JSON.stringify(kernelSize)}, groups ${groups}.`,
      );
    }
    if (inChannels % groups !== 0 || outChannels % groups !== 0) {
      throw new ValueError(
        `Conv2d: in channels ${inChannels} and out channels ${outChannels} must both divide by ` +
          `groups ${groups}.`,
      );
    }
    const init = { ...options, seed: generatorOf(options.seed) };
    const fanIn = (inChannels / groups) * kh * kw;
    const bound = 1 / Math.sqrt(fanIn);
    this.weight = this.registerParameter(
      "weight",
      uniformTensor([outChannels, inChannels / groups, kh, kw], bound, init),
    );
    this.bias = options.bias === false
      ? null
      : this.registerParameter("bias", uniformTensor([outChannels], bound, init));
    this.options = {
      stride: options.stride,
      padding: options.padding,
      dilation: options.dilation,
      groups,
      activation: options.activation,
    };
  }

  /** x [N, C, H, W] → [N, O, H', W']. */
  forward(x: Tensor): Tensor {
    return conv2d(x, this.weight, { ...this.options, bias: this.bias });
  }

  /**
   * This layer with its epilogue activation replaced for one call: what
   * `Sequential` runs when a `ReLU` layer follows this one (one kernel
   * instead of two, the same results).
   *
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { Conv2d, initGpu, relu, Tensor } from "../mod.ts";
   * const gpu = await initGpu({ matmulTiling: "default" });
   * const conv = new Conv2d(1, 2, 2, { seed: 1 });
   * const x = Tensor.from([1, -2, 3, 0.5, -1, 2, 0, 1, -3], [1, 1, 3, 3]);
   * const fused = await conv.forwardFused(x, { activation: "relu" }).read();
   * assert.equal(fused.join(), (await relu(conv.forward(x)).read()).join());
   * gpu.destroy();
   * ```
   */
  forwardFused(x: Tensor, fused: { activation?: "none" | "relu" }): Tensor {
    const activation = fused.activation ?? this.options.activation;
    return conv2d(x, this.weight, { ...this.options, activation, bias: this.bias });
  }
}
