/** Sequential: modules applied one after another, optionally checkpointed. */
import { fail, isGradEnabled, shortValue, type Tensor, ValueError } from "../gpu/mod.ts";
import {
  type CheckpointPlan,
  checkSegmentSpec,
  planCheckpointSegments,
  runCheckpointed,
  type SegmentSpec,
} from "./checkpoint.ts";
import { Module } from "./module.ts";
import { type ForwardStep, planForwardSteps } from "./activation_fusion.ts";

/**
 * Applies its layers in order; they are named "0", "1", ... so parameters
 * read `0.weight`, `2.bias`, as in PyTorch, and a model written as
 * `torch.nn.Sequential` is written the same way here: a `ReLU` after a
 * `Linear` or `Conv2d` runs fused into that layer's matmul epilogue, and a
 * `GELU` before a `Linear` as its input GELU (see `fuseActivations`), with
 * the same results as running them one by one. Set `checkpoint` to train with
 * gradient checkpointing without rewriting the forward pass.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Linear, ReLU, Sequential, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const mlp = new Sequential(new Linear(4, 8, { seed: 1 }), new ReLU(), new Linear(8, 2));
 * mlp.checkpoint = "auto"; // ≈ √n checkpointed segments while training
 * const logits = mlp.forward(Tensor.from([1, 2, 3, 4], [1, 4]));
 * assert.equal(logits.shape.join(), "1,2");
 * assert.notEqual(mlp.lastCheckpointPlan, null);
 * assert.equal(mlp.namedParameters()[0][0], "0.weight");
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
  /**
   * The plan the last checkpointed forward used (segments as layer indices,
   * and estimated memory). Fused layers stay in one segment, so `"auto"`
   * gives about √(number of steps) segments.
   */
  lastCheckpointPlan: CheckpointPlan | null = null;
  /**
   * Run a ReLU that follows a Linear or Conv2d in that layer's epilogue and a
   * GELU that precedes a Linear as its input GELU (default true): fewer
   * kernels and activations kept for backward, bit-identical results. False
   * runs every layer on its own.
   */
  fuseActivations = true;
  readonly #fusedSteps: readonly ForwardStep[];
  readonly #fusedModules: readonly Module[];

  /** A sequence of `layers`. */
  constructor(...layers: Module[]) {
    super();
    layers.forEach((layer, i) => {
      if (!(layer instanceof Module)) {
        fail(ValueError, "Sequential", `layer ${i} is ${shortValue(layer)}, not a Module.`);
      }
    });
    this.layers = layers.map((layer, i) => this.registerModule(String(i), layer));
    this.#fusedSteps = planForwardSteps(this.layers);
    this.#fusedModules = this.#fusedSteps.map((step) => step.module);
  }

  /** Runs every layer in turn (checkpointed segments when `checkpoint` is set and training). */
  forward(x: Tensor): Tensor {
    const fuse = this.fuseActivations && this.#fusedModules.length < this.layers.length;
    const modules = fuse ? this.#fusedModules : this.layers;
    if (this.checkpoint !== null && this.training && isGradEnabled()) {
      const plan = planCheckpointSegments(modules, x, this.checkpoint);
      const steps = this.#fusedSteps;
      this.lastCheckpointPlan = fuse
        ? { ...plan, segments: plan.segments.map(([a, b]) => [steps[a].first, steps[b - 1].end]) }
        : plan;
      return runCheckpointed(modules, plan, x);
    }
    let h = x;
    for (const layer of modules) {
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
