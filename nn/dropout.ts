/** The Dropout layer. */
import { dropout, type RandomGenerator, type Tensor, ValueError } from "../gpu/mod.ts";
import { generatorOf } from "./init.ts";
import { Module } from "./module.ts";

/**
 * In training mode zeroes each element with probability `p` and scales the
 * rest by 1/(1 − p); in eval mode passes the input through. Masks come from a
 * seeded counter-based generator, so a run is reproducible and a mask can be
 * regenerated exactly.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { Dropout, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const drop = new Dropout(0.5, { seed: 7 });
 * const x = Tensor.full([8], 1);
 * const y = drop.forward(x); // training mode: each element 0 or 1 / (1 − p)
 * assert.ok((await y.read()).every((v) => v === 0 || v === 2));
 * assert.equal(drop.eval().forward(x), x); // eval mode: the input itself
 * gpu.destroy();
 * ```
 */
export class Dropout extends Module {
  /** Drop probability. */
  readonly p: number;
  /** The generator masks are drawn from (its offset advances each training forward). */
  readonly generator: RandomGenerator;

  /** A dropout layer with drop probability `p`. */
  constructor(p = 0.5, options: { seed?: number | RandomGenerator } = {}) {
    super();
    if (!(p >= 0 && p < 1)) throw new ValueError(`Dropout: p must be in [0, 1), got ${p}.`);
    this.p = p;
    this.generator = generatorOf(options.seed);
  }

  /** Masks `x` in training mode; returns `x` itself in eval mode or when p = 0. */
  forward(x: Tensor): Tensor {
    if (!this.training || this.p === 0) return x;
    return dropout(x, this.p, this.generator.take(x.size));
  }
}
