/**
 * How a `Sequential` runs its layers: a ReLU layer right after a Linear or
 * Conv2d runs in that layer's matmul epilogue (one kernel, and backward reads
 * the layer's output instead of keeping a second activation), and a GELU
 * layer right before a Linear runs as that Linear's input GELU (recomputed in
 * backward instead of kept). The layers themselves stay where they are, so
 * the model keeps PyTorch's structure and names (`0.weight`, `2.weight` for
 * `Sequential(Linear, ReLU, Linear)`); only the forward pass is planned.
 */
import type { Tensor } from "../gpu/mod.ts";
import { GELU, ReLU } from "./activation.ts";
import { Conv2d } from "./conv.ts";
import { Linear } from "./linear.ts";
import { Module } from "./module.ts";

/** One step of a planned forward pass: layers [first, end) run as `module`. */
export interface ForwardStep {
  /** Index of the step's first layer. */
  readonly first: number;
  /** One past its last layer. */
  readonly end: number;
  /** What runs: the layer itself, or a fused stand-in for the step's layers. */
  readonly module: Module;
}

/** What a fused step hands its Linear or Conv2d in place of the layers it absorbed. */
interface Fused {
  activation?: "relu";
  geluInput?: "none" | "tanh";
}

/**
 * Runs a Linear or Conv2d with the activations of its neighbours fused in.
 * It is not registered anywhere: parameters stay the layer's own, and
 * training mode is the layer's (the absorbed activations have none).
 */
class FusedLayer extends Module {
  constructor(readonly layer: Linear | Conv2d, readonly fused: Fused) {
    super();
    this.training = layer.training;
  }

  forward(x: Tensor): Tensor {
    return this.layer instanceof Linear
      ? this.layer.forwardFused(x, this.fused)
      : this.layer.forwardFused(x, this.fused);
  }

  override train(mode = true): this {
    this.layer.train(mode);
    this.training = mode;
    return this;
  }
}

/**
 * Whether `module` is a `kind` whose forward is `kind`'s own: a subclass
 * that overrides forward (an adapter, a hook) runs as written, unfused.
 */
function plain<T extends Module>(
  module: Module | undefined,
  kind: abstract new (...args: never[]) => T,
): module is T {
  return module instanceof kind && module.forward === kind.prototype.forward;
}

/** `module`'s own epilogue activation ("none" when it has none to replace). */
function ownActivation(module: Linear | Conv2d): string {
  return (module instanceof Linear ? module.activation : module.options.activation) ?? "none";
}

/**
 * Plans the forward pass of `layers` with fusion (see the module docs): each
 * layer once, in order, grouped into steps. Without anything to fuse every
 * step is one layer run as itself.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Linear, ReLU } from "../mod.ts";
 * import { planForwardSteps } from "./activation_fusion.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const steps = planForwardSteps([new Linear(4, 8), new ReLU(), new Linear(8, 2)]);
 * assert.equal(steps.map((s) => `${s.first},${s.end}`).join(" "), "0,2 2,3");
 * gpu.destroy();
 * ```
 */
export function planForwardSteps(layers: readonly Module[]): ForwardStep[] {
  const steps: ForwardStep[] = [];
  for (let i = 0; i < layers.length;) {
    const fused: Fused = {};
    let layer: Linear | Conv2d | null = null, end = i + 1;
    const here = layers[i], next = layers[i + 1];
    if (plain(here, GELU) && plain(next, Linear) && next.geluInput === undefined) {
      layer = next;
      fused.geluInput = here.approximate;
      end = i + 2;
    } else if (plain(here, Linear) || plain(here, Conv2d)) {
      layer = here;
    }
    if (layer && ownActivation(layer) === "none" && plain(layers[end], ReLU)) {
      fused.activation = "relu";
      end++;
    }
    const module = layer && end > i + 1 ? new FusedLayer(layer, fused) : here;
    steps.push({ first: i, end, module });
    i = end;
  }
  return steps;
}
