/** Sequential: modules applied one after another, optionally checkpointed. */
import { isGradEnabled } from "../gpu/autograd.ts";
import type { Tensor } from "../gpu/tensor.ts";
import {
  type CheckpointPlan,
  checkSegmentSpec,
  planCheckpointSegments,
  runCheckpointed,
  type SegmentSpec,
} from "./checkpoint.ts";
import { Module } from "./module.ts";
import { fail, ValueError } from "../gpu/errors.ts";
import { shortValue } from "../gpu/short_text.ts";

/**
 * Applies its layers in order; they are named "0", "1", ... so parameters
 * read `0.weight`, `2.bias`, as in PyTorch. Set `checkpoint` to train with
 * gradient checkpointing without rewriting the forward pass.
 *
 * @example
 * ```ts
 * import { initGpu, Linear, ReLU, Sequential, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const mlp = new Sequential(new Linear(4, 8, { seed: 1 }), new ReLU(), new Linear(8, 2));
 * mlp.checkpoint = "auto"; // ≈ √n checkpointed segments while training
 * const logits = mlp.forward(Tensor.from([1, 2, 3, 4], [1, 4]));
 * console.assert(logits.shape.join() === "1,2" && mlp.lastCheckpointPlan !== null);
 * console.assert(mlp.namedParameters()[0][0] === "0.weight");
 * gpu.destroy();
 * ```
 */
export class Sequential extends Module {
  /** The layers, in order. */
  readonly layers: readonly Module[];
  #checkpoint: SegmentSpec | null = null;
  /**
   * Gradient checkpointing while training with the tape on: a segment count,
   * `"auto"` (≈ √n), or `{ budgetBytes }`; null (default) keeps every activation.
   * Any other value is refused when set.
   */
  get checkpoint(): SegmentSpec | null {
    return this.#checkpoint;
  }
  set checkpoint(spec: SegmentSpec | null) {
    if (spec !== null) checkSegmentSpec("Sequential.checkpoint", spec);
    this.#checkpoint = spec;
  }
  /** The plan the last checkpointed forward used (segments and estimated memory). */
  lastCheckpointPlan: CheckpointPlan | null = null;

  /** A sequence of `layers`. */
  constructor(...layers: Module[]) {
    super();
    layers.forEach((layer, i) => {
      if (!(layer instanceof Module)) {
        fail(ValueError, "Sequential", `layer ${i} is ${shortValue(layer)}, not a Module.`);
      }
    });
    this.layers = layers.map((layer, i) => this.registerModule(String(i), layer));
  }

  /** Runs every layer in turn (checkpointed segments when `checkpoint` is set and training). */
  forward(x: Tensor): Tensor {
    if (this.checkpoint !== null && this.training && isGradEnabled()) {
      this.lastCheckpointPlan = planCheckpointSegments(this.layers, x, this.checkpoint);
      return runCheckpointed(this.layers, this.lastCheckpointPlan, x);
    }
    let h = x;
    for (const layer of this.layers) {
      const next = layer.forward(h);
      // Our handle of each intermediate goes as soon as the next layer has
      // run (the tape keeps its own handle of what backward needs), so
      // outputs nobody saved are freed now, not when the caller's scope ends.
      if (h !== x && next !== h) h.dispose();
      h = next;
    }
    return h;
  }
}
