/**
 * The linear layer op: x·Wᵀ + bias in one kernel, with an optional ReLU in
 * the epilogue and an optional GELU of the input that is recomputed in
 * backward instead of saved.
 */
import { ShapeError, ValueError } from "../base/errors.ts";
import { record } from "../tensor/autograd.ts";
import { launchBinary, launchUnary } from "../kernels/elementwise.ts";
import { launchGeluBackward } from "../kernels/gelu_backward.ts";
import { launchMatmul } from "../kernels/gemm/matmul.ts";
import { launchReduce } from "../kernels/reduce.ts";
import { gradDtypeOf, Tensor } from "../tensor/tensor.ts";
import { autocastInputs, releaseCasts } from "../tensor/autocast_hook.ts";
import type { DType } from "../base/dtype.ts";
import { product, resolve, type Resolved } from "./matmul.ts";
import { assertTensors } from "./checks.ts";

/** Options of {@link linear}. */
export interface LinearOptions {
  /** Bias [out] in f32 or x's dtype (default none). */
  bias?: Tensor | null;
  /** Activation fused into the matmul epilogue (default `"none"`). */
  activation?: "none" | "relu";
  /**
   * Apply GELU to x before the product: y = gelu(x)·Wᵀ + b, the form of a
   * transformer MLP's second layer (`"none"`: exact erf GELU, `"tanh"`: the
   * tanh approximation). Unlike `linear(gelu(x), W)`, gelu(x) is not kept for
   * backward: only x is, and backward recomputes gelu(x) for the weight
   * gradient in the same pass that applies gelu′(x) to x's gradient (GELU
   * evaluated once, gpu/kernels/gelu_backward.ts), so the layer keeps one
   * activation of its input's size instead of two. Default: no GELU.
   */
  geluInput?: "none" | "tanh";
}

/** The unary kernel of each GELU form (the tanh form is the kernel named "gelu"). */
const GELU_KERNEL = { none: "gelu_erf", tanh: "gelu" } as const;

/**
 * The fused linear layer op: x·Wᵀ + bias, then an optional ReLU, in one
 * kernel. `x` is [N, in] or [B, T, in]; `weight` is [out, in] (PyTorch's
 * layout); `options.bias` is [out] in f32 or x's dtype.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, linear, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2], [1, 2]); // [N, in]
 * const w1 = Tensor.from([1, 1, -1, -1], [2, 2]); // [out, in]
 * const b1 = Tensor.from([0.5, 0.5], [2]);
 * const h = linear(x, w1, { bias: b1, activation: "relu" });
 * assert.equal((await h.read()).join(), "3.5,0");
 * gpu.destroy();
 * ```
 */
export function linear(x0: Tensor, weight0: Tensor, options: LinearOptions = {}): Tensor {
  assertTensors("linear", x0, weight0);
  // The bias stays as given: the epilogue adds an f32 bias to f16 products.
  const [x, weight] = autocastInputs("linear", [x0, weight0]);
  const gradTarget = weightGradTarget(weight0, weight);
  const layer = linearForward("linear", x, weight, options, gradDtypeOf(gradTarget));
  const bias = options.bias ?? null;
  const y = record({
    op: "linear",
    inputs: bias ? [x, gradTarget, bias] : [x, gradTarget],
    output: layer.y,
    save: layer.save,
    backward: (g, [sx, sw, sy], needs) => {
      const [gx, gw, gb] = layer.backward(g, sx, sw, sy, needs);
      return bias ? [gx, gw, gb] : [gx, gw];
    },
  });
  return releaseCasts([weight], y);
}

/**
 * The tensor a product's weight gradient is recorded against. Autocast hands
 * an f16 op a narrower copy of an f32 weight (a master's f16 working copy,
 * or a cast); the op then takes the f32 weight itself as its tape input and
 * writes the weight gradient in f32 straight from the product's f32
 * accumulators. That skips rounding it to f16 and casting it back up (a
 * dispatch and an f16 round trip per weight and step), and weight gradients
 * below f16's range no longer flush to zero (PyTorch's autocast rounds them
 * to f16 first). A weight with a `gradDtype` (apex O2's half-precision
 * gradients) gets it in that dtype instead, still from the f32 accumulators:
 * callers write `gradDtypeOf(target)`.
 */
export function weightGradTarget(given: Tensor, used: Tensor): Tensor {
  return used !== given && given.dtype === "f32" && used.dtype !== "f32" ? given : used;
}

/** A linear layer's forward result: y, what its backward needs saved, and the backward. */
export interface LinearLayerRun {
  /** The output [..., out]. */
  y: Tensor;
  /** What backward reads: x and the weight, and y after a ReLU. */
  save: Tensor[];
  /** [dx, dW, db] (null where `needs` is false or there is no bias) from the output gradient. */
  backward(
    g: Tensor,
    x: Tensor,
    weight: Tensor,
    y: Tensor | undefined,
    needs: readonly boolean[],
  ): (Tensor | null)[];
}

/**
 * The product of a linear layer with x and W already in their compute dtype:
 * checks, the fused kernel, and the backward rule (no tape), whose weight
 * gradient comes in `weightGradDtype` (see {@link weightGradTarget}). `op`
 * names the caller in errors. Shared by {@link linear} and `layerNormLinear`.
 */
export function linearForward(
  op: string,
  x: Tensor,
  weight: Tensor,
  options: LinearOptions,
  weightGradDtype: DType = weight.dtype,
): LinearLayerRun {
  const activation = options.activation ?? "none";
  const geluInput = options.geluInput;
  if (geluInput !== undefined && !(geluInput in GELU_KERNEL)) {
    throw new ValueError(
      `${op}: geluInput must be "none" or "tanh", not ${JSON.stringify(geluInput)}.`,
    );
  }
  const bias = options.bias ?? null;
  const inFeatures = x.shape.at(-1)!;
  const rows = x.size / Math.max(inFeatures, 1);
  const x2 = x.share([rows, inFeatures]);
  let resolved: Resolved;
  try {
    resolved = resolve(op, x2, weight, false, true);
  } catch (e) {
    x2.dispose();
    throw e;
  }
  const outFeatures = resolved.problem.n;
  if (bias && (bias.rank !== 1 || bias.shape[0] !== outFeatures)) {
    x2.dispose();
    throw new ShapeError(
      `${op}: bias ${bias.describe()} must have shape [${outFeatures}] to match ` +
        `weight ${weight.describe()}.`,
    );
  }
  // gelu(x) lives only while a product reads it: here, and again in backward.
  const geluOf = (t: Tensor) => Tensor.adopt(launchUnary(GELU_KERNEL[geluInput!], t));
  const input = geluInput ? geluOf(x2) : x2;
  const shape = [...x.shape.slice(0, -1), outFeatures];
  const epilogue = { bias: bias ?? undefined, activation };
  const y = Tensor.adopt(launchMatmul(resolved.problem, input, weight, { shape }, epilogue));
  if (input !== x2) input.dispose();
  x2.dispose();
  const backward = (
    g: Tensor,
    sx: Tensor,
    sw: Tensor,
    sy: Tensor | undefined,
    needs: readonly boolean[],
  ): (Tensor | null)[] => {
    // ReLU's gradient from its output: y > 0 exactly where the pre-activation is.
    const gPre = activation === "relu" ? Tensor.adopt(launchBinary("relu_grad", g, sy!)) : g;
    const g2 = gPre.share([rows, outFeatures]), xs = sx.share([rows, inFeatures]);
    let gw: Tensor | null = null;
    let flat: Tensor | null = null;
    if (geluInput && needs[0] && needs[1]) {
      // One pass gives gelu(x) and, over the product's gradient, x's gradient: GELU once.
      flat = product(g2, sw, false, false);
      const read = Tensor.adopt(launchGeluBackward(GELU_KERNEL[geluInput], xs, flat));
      gw = product(g2, read, true, false, weightGradDtype);
      read.dispose();
    } else {
      if (needs[1]) {
        const read = geluInput ? geluOf(xs) : xs;
        gw = product(g2, read, true, false, weightGradDtype);
        if (read !== xs) read.dispose();
      }
      if (needs[0]) {
        flat = product(g2, sw, false, false);
        if (geluInput) {
          const through = Tensor.adopt(launchBinary(`${GELU_KERNEL[geluInput]}_grad`, flat, xs));
          flat.dispose();
          flat = through;
        }
      }
    }
    const gx = flat ? flat.share(sx.shape) : null;
    flat?.dispose();
    const gb = bias && needs[2]
      ? Tensor.adopt(
        launchReduce("sum", g2, { outer: 1, axis: rows, inner: outFeatures }, bias.shape, {
          out: bias.dtype,
        }),
      )
      : null;
    g2.dispose();
    xs.dispose();
    if (gPre !== g) gPre.dispose();
    return [gx, gw, gb];
  };
  return { y, save: activation === "relu" ? [x, weight, y] : [x, weight], backward };
}
