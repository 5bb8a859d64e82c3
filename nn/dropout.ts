/** The Dropout layer. */
import { dropout } from "../gpu/ops/dropout.ts";
import type { RandomGenerator } from "../gpu/random.ts";
import type { Tensor } from "../gpu/tensor.ts";
import { generatorOf } from "./init.ts";
import { Module } from "./module.ts";

/**
 * In training mode zeroes each element with probability `p` and scales the
 * rest by 1/(1 − p); in eval mode passes the input through. Masks come from a
 * seeded counter-based generator, so a run is reproducible and a mask can be
 * regenerated exactly.
 *
 * @example
 * ```ts ignore
 * const drop = new Dropout(0.1, { seed: 7 });
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
    if (!(p >= 0 && p < 1)) throw new RangeError(`Dropout: p must be in [0, 1), got ${p}.`);
    this.p = p;
    this.generator = generatorOf(options.seed);
  }

  /** Masks `x` in training mode; returns `x` itself in eval mode or when p = 0. */
  forward(x: Tensor): Tensor {
    if (!this.training || this.p === 0) return x;
    return dropout(x, this.p, this.generator.take(x.size));
  }
}
