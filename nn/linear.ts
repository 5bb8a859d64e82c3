/** The fully connected layer. */
import {
  fail,
  layerNormLinear,
  type LayerNormOptions,
  linear,
  sameShape,
  ShapeError,
  shapeString,
  type Tensor,
  ValueError,
} from "../gpu/mod.ts";
import { generatorOf, type ParameterOptions, uniformTensor } from "./init.ts";
import { Module } from "./module.ts";

/** Options of {@link Linear}. */
export interface LinearLayerOptions extends ParameterOptions {
  /** Add a bias (default true; PyTorch's `bias`). */
  bias?: boolean;
  /** Fuse a ReLU into the matmul epilogue (default "none"). */
  activation?: "none" | "relu";
  /**
   * Apply GELU to the input first (`"none"`: exact, `"tanh"`: approximate),
   * recomputed in backward instead of kept: the same result as a GELU layer
   * before this one, with one activation less held for backward (see
   * `linear`'s `geluInput`). Default: no GELU.
   */
  geluInput?: "none" | "tanh";
  /**
   * Use this tensor as the weight instead of drawing one: tied weights, e.g.
   * a language model's head sharing its token embedding's table [vocab, dim]
   * (nanoGPT's `lm_head`). It must be [out, in] in the layer's dtype; it gets
   * the gradients of both uses, and `parameters()` lists it once.
   */
  weight?: Tensor;
}

/**
 * y = x·Wᵀ + b with W of shape [out, in] (PyTorch's layout), initialised as
 * PyTorch does: W and b uniform in ±1/√in (Kaiming-uniform with a = √5),
 * from a seeded generator.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Linear, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const layer = new Linear(4, 3, { seed: 1, activation: "relu" });
 * const x = Tensor.from([1, 2, 3, 4, -4, -3, -2, -1], [2, 4]);
 * const h = layer.forward(x); // [batch, 3]
 * assert.equal(h.shape.join(), "2,3");
 * assert.ok((await h.read()).every((v) => v >= 0));
 * gpu.destroy();
 * ```
 */
export class Linear extends Module {
  /** Weight [out, in]. */
  readonly weight: Tensor;
  /** Bias [out], or null. */
  readonly bias: Tensor | null;
  /** The fused activation. */
  readonly activation: "none" | "relu";
  /** The GELU applied to the input, if any. */
  readonly geluInput: "none" | "tanh" | undefined;

  /** A layer mapping `inFeatures` to `outFeatures`. */
  constructor(inFeatures: number, outFeatures: number, options: LinearLayerOptions = {}) {
    super();
    if (
      !(Number.isInteger(inFeatures) && inFeatures > 0 && Number.isInteger(outFeatures) &&
        outFeatures > 0)
    ) {
      throw new ValueError(
        `Linear: features must be positive integers, got ${inFeatures} → ${outFeatures}.`,
      );
    }
    const init = { ...options, seed: generatorOf(options.seed) };
    const bound = 1 / Math.sqrt(inFeatures);
    const shape = [outFeatures, inFeatures], shared = options.weight;
    if (shared && (shared.dtype !== (options.dtype ?? "f32") || !sameShape(shared.shape, shape))) {
      fail(
        ShapeError,
        "Linear",
        `a shared weight must be ${options.dtype ?? "f32"} ${shapeString(shape)} ` +
          `for ${inFeatures} → ${outFeatures} features, got ${shared.describe()}.`,
      );
    }
    this.weight = this.registerParameter("weight", shared ?? uniformTensor(shape, bound, init));
    this.bias = options.bias === false
      ? null
      : this.registerParameter("bias", uniformTensor([outFeatures], bound, init));
    this.activation = options.activation ?? "none";
    this.geluInput = options.geluInput;
  }

  /** x [..., in] → [..., out]. */
  forward(x: Tensor): Tensor {
    return this.forwardFused(x, {});
  }

  /**
   * This layer with its epilogue activation or input GELU replaced for one
   * call: what `Sequential` runs when a `ReLU` layer follows this one
   * (`{ activation: "relu" }`, one kernel instead of two, the same results).
   *
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { initGpu, Linear, relu, Tensor } from "../mod.ts";
   * const gpu = await initGpu({ matmulTiling: "default" });
   * const layer = new Linear(2, 3, { seed: 1 });
   * const x = Tensor.from([1, -2, 3, 0.5], [2, 2]);
   * const fused = await layer.forwardFused(x, { activation: "relu" }).read();
   * assert.equal(fused.join(), (await relu(layer.forward(x)).read()).join());
   * gpu.destroy();
   * ```
   */
  forwardFused(x: Tensor, fused: Pick<LinearLayerOptions, "activation" | "geluInput">): Tensor {
    const activation = fused.activation ?? this.activation;
    const geluInput = fused.geluInput ?? this.geluInput;
    return linear(x, this.weight, { bias: this.bias, activation, geluInput });
  }

  /**
   * This layer applied to `layerNorm(x, norm)` (a `LayerNorm` module will do
   * as `norm`), keeping x rather than the normalised rows for backward: the
   * same results and gradients, one activation fewer held (see
   * `layerNormLinear`).
   */
  forwardNormalized(x: Tensor, norm: LayerNormOptions): Tensor {
    const { bias, activation, geluInput } = this;
    return layerNormLinear(x, this.weight, { bias, activation, geluInput, norm });
  }
}
