/** The Embedding layer. */
import { embedding, type Tensor } from "../gpu/mod.ts";
import { normalTensor, type ParameterOptions } from "./init.ts";
import { Module } from "./module.ts";

/**
 * A table of `count` vectors of size `dim`, initialised N(0, 1) as in
 * PyTorch; `forward(ids)` looks up i32 ids.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { Embedding, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const emb = new Embedding(27, 64, { seed: 3 });
 * const x = emb.forward(Tensor.from([1, 2, 3], [3], { dtype: "i32" })); // [3, 64]
 * assert.equal(x.shape.join(), "3,64");
 * gpu.destroy();
 * ```
 */
export class Embedding extends Module {
  /** The table [count, dim]. */
  readonly weight: Tensor;

  /** A table of `count` rows of size `dim`. */
  constructor(count: number, dim: number, options: ParameterOptions = {}) {
    super();
    this.weight = this.registerParameter("weight", normalTensor([count, dim], 1, options));
  }

  /** ids (i32, any shape) → [...ids.shape, dim]. */
  forward(ids: Tensor): Tensor {
    return embedding(this.weight, ids);
  }
}
