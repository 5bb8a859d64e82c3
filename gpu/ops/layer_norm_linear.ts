/**
 * LayerNorm then a linear layer as one op that keeps the LayerNorm's input
 * instead of its output: backward normalises the rows again for the weight
 * gradient, from the per-row mean and rstd the forward saved (one
 * elementwise pass, no second statistics pass). A transformer block has two such pairs (norm1 → qkv, norm2 →
 * fc1), and the LayerNorm's input (the residual stream) is kept anyway, so
 * each pair keeps one activation fewer.
 */
import { record } from "../tensor/autograd.ts";
import { autocastDtypes, autocastInputs, releaseCasts } from "../tensor/autocast_hook.ts";
import {
  launchLayerNorm,
  launchLayerNormBackward,
  launchLayerNormFromStats,
  launchLayerNormParamGrads,
} from "../kernels/rows/layer_norm.ts";
import { gradDtypeOf, Tensor } from "../tensor/tensor.ts";
import { checkLayerNormInputs, type LayerNormOptions } from "./layer_norm.ts";
import { linearForward, type LinearOptions, weightGradTarget } from "./linear.ts";

/** Options of {@link layerNormLinear}: the LayerNorm's, and the linear layer's. */
export interface LayerNormLinearOptions extends LinearOptions {
  /** The LayerNorm before the product: weight, bias (f32 [in]) and eps. */
  norm: LayerNormOptions;
}

/**
 * `linear(layerNorm(x, options.norm), weight, options)` with the same results
 * and gradients bit for bit, keeping x (which the caller's residual stream
 * holds anyway) rather than the normalised rows for backward. Under autocast
 * the LayerNorm runs in f32 and the product in f16, as they do apart, but
 * with no cast between them: the LayerNorm writes its rows in the dtype the
 * product reads, and its backward reads the product's gradient as it comes.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, layerNormLinear, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2, 3, 4], [1, 4]);
 * const w = Tensor.from([1, 1, 1, 1, 1, -1, 1, -1], [2, 4]); // [out, in]
 * const y = layerNormLinear(x, w, { norm: {} }); // normalised x = [-1.34, -0.45, 0.45, 1.34]
 * const [sum, alternating] = await y.read();
 * assert.ok(Math.abs(sum) < 1e-5, `sum ${sum}`);
 * assert.ok(Math.abs(alternating + 1.789) < 1e-3, `alternating ${alternating}`);
 * gpu.destroy();
 * ```
 */
export function layerNormLinear(
  x0: Tensor,
  weight0: Tensor,
  options: LayerNormLinearOptions,
): Tensor {
  const [x] = autocastInputs("layer_norm", [x0]);
  const norm = options.norm;
  const eps = norm.eps ?? 1e-5;
  const nw = norm.weight ?? null, nb = norm.bias ?? null;
  checkLayerNormInputs(x, nw, nb, eps);
  // The rows are written in the dtype the linear layer's autocast gives them.
  const [readDtype] = autocastDtypes("linear", [x, weight0]);
  const launched = launchLayerNorm(x, nw, nb, eps, readDtype);
  const normalised = {
    y: Tensor.adopt(launched.y),
    mean: Tensor.adopt(launched.mean),
    rstd: Tensor.adopt(launched.rstd),
  };
  const [rows, weight] = autocastInputs("linear", [normalised.y, weight0]);
  const rowsDtype = rows.dtype; // readDtype, unless a hook that cannot say cast them
  const gradTarget = weightGradTarget(weight0, weight);
  if (rows !== normalised.y) normalised.y.dispose();
  let layer;
  try {
    layer = linearForward("layerNormLinear", rows, weight, options, gradDtypeOf(gradTarget));
  } finally {
    rows.dispose();
  }
  const bias = options.bias ?? null;
  const parameters = [nw, nb, gradTarget, bias].filter((t): t is Tensor => t !== null);
  try {
    const y = record({
      op: "linear",
      inputs: [x, ...parameters],
      output: layer.y,
      save: [
        x,
        normalised.mean,
        normalised.rstd,
        weight,
        ...(nw ? [nw] : []),
        ...(nb ? [nb] : []),
        ...(
          options.activation === "relu" ? [layer.y] : []
        ),
      ],
      backward: (g, saved, needs) => {
        const [sx, mean, rstd, sw] = saved;
        const sNw = nw ? saved[4] : null, sNb = nb ? saved[4 + (nw ? 1 : 0)] : null;
        const sy = options.activation === "relu" ? saved.at(-1) : undefined;
        // needs follows inputs: x, then the LayerNorm's weight and bias, W, the bias.
        const at = { nw: 1, nb: 1 + (nw ? 1 : 0), w: 1 + (nw ? 1 : 0) + (nb ? 1 : 0) };
        // The forward's statistics, not a second pass of reductions: the same rows bit for bit.
        const again = Tensor.adopt(launchLayerNormFromStats(
          sx,
          { weight: sNw, bias: sNb },
          { mean, rstd },
          rowsDtype,
        ));
        const needsNormGrad = needs[0] || (nw !== null && needs[at.nw]) ||
          (nb !== null && needs[at.nb]);
        const [dRead, dW, dBias] = layer!.backward(g, again, sw, sy, [
          needsNormGrad,
          needs[at.w],
          bias !== null && needs[at.w + 1],
        ]);
        again.dispose();
        let dx: Tensor | null = null, dNw: Tensor | null = null, dNb: Tensor | null = null;
        if (dRead) {
          // dRead is in the product's dtype: the kernels read it as it is.
          if (needs[0]) dx = Tensor.adopt(launchLayerNormBackward(sx, sNw, dRead, mean, rstd));
          const want = {
            weight: nw !== null && needs[at.nw],
            bias: nb !== null && needs[at.nb],
          };
          const grads = launchLayerNormParamGrads(sx, dRead, mean, rstd, want);
          dNw = grads.dw && Tensor.adopt(grads.dw);
          dNb = grads.db && Tensor.adopt(grads.db);
          dRead.dispose();
        }
        return [
          dx,
          ...(nw ? [dNw] : []),
          ...(nb ? [dNb] : []),
          dW,
          ...(bias ? [dBias] : []),
        ];
      },
    });
    return releaseCasts([weight], y);
  } finally {
    normalised.mean.dispose();
    normalised.rstd.dispose();
  }
}
