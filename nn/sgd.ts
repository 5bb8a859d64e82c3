/** Plain stochastic gradient descent on f32 parameters (the fused AMP optimizers live in amp/). */
import { noGrad } from "../gpu/autograd.ts";
import { addInPlace } from "../gpu/ops/in_place.ts";
import type { Tensor } from "../gpu/tensor.ts";

/**
 * p ← p − lr·∇p for every parameter that has a gradient, on the GPU, then
 * (by `zeroGrad`) frees the gradients.
 *
 * @example
 * ```ts ignore
 * const opt = new SGD(model.parameters(), { lr: 0.1 });
 * loss.backward();
 * opt.step();
 * opt.zeroGrad();
 * ```
 */
export class SGD {
  /** The parameters updated. */
  readonly params: readonly Tensor[];
  /** Learning rate. */
  lr: number;

  /** An optimizer over `params`. */
  constructor(params: readonly Tensor[], options: { lr: number }) {
    if (!(options.lr > 0)) throw new RangeError(`SGD: lr must be positive, got ${options.lr}.`);
    this.params = params;
    this.lr = options.lr;
  }

  /** Applies one update; records nothing on the tape and does not wait for the GPU. */
  step(): void {
    noGrad(() => {
      for (const p of this.params) if (p.grad) addInPlace(p, p.grad, { alpha: -this.lr });
    });
  }

  /** Frees every gradient. */
  zeroGrad(): void {
    for (const p of this.params) {
      p.grad?.dispose();
      p.grad = null;
    }
  }
}
