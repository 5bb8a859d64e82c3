/** Stochastic gradient descent with momentum on f32 parameters (the fused AMP optimizers live in amp/). */
import { noGrad } from "../gpu/autograd.ts";
import { addInPlace } from "../gpu/ops/in_place.ts";
import type { FloatDType } from "../gpu/dtype.ts";
import { untracked } from "../gpu/scope.ts";
import { Tensor } from "../gpu/tensor.ts";

/** Options of {@link SGD}. */
export interface SGDOptions {
  /** Learning rate. */
  lr: number;
  /** Momentum factor in [0, 1) (default 0: plain SGD). */
  momentum?: number;
}

/**
 * torch.optim.SGD without dampening: v ← m·v + ∇p, p ← p − lr·v (with m = 0,
 * p ← p − lr·∇p), on the GPU, for every parameter that has a gradient.
 *
 * @example
 * ```ts ignore
 * const opt = new SGD(model.parameters(), { lr: 0.1, momentum: 0.9 });
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
  /** Momentum factor. */
  readonly momentum: number;
  #velocity: (Tensor | null)[];

  /** An optimizer over `params`. */
  constructor(params: readonly Tensor[], options: SGDOptions) {
    const momentum = options.momentum ?? 0;
    if (!(options.lr > 0)) throw new RangeError(`SGD: lr must be positive, got ${options.lr}.`);
    if (!(momentum >= 0 && momentum < 1)) {
      throw new RangeError(`SGD: momentum must be in [0, 1), got ${momentum}.`);
    }
    this.params = params;
    this.lr = options.lr;
    this.momentum = momentum;
    this.#velocity = params.map(() => null);
  }

  /** Applies one update; records nothing on the tape and does not wait for the GPU. */
  step(): void {
    noGrad(() =>
      this.params.forEach((p, i) => {
        if (!p.grad) return;
        let direction = p.grad;
        if (this.momentum > 0) {
          // The optimizer owns its state: created outside any tidy() scope.
          const v = this.#velocity[i] ??= untracked(() =>
            Tensor.zeros(p.shape, { dtype: p.dtype as FloatDType, gpu: p.gpu })
          );
          addInPlace(v, p.grad, { beta: this.momentum });
          direction = v;
        }
        addInPlace(p, direction, { alpha: -this.lr });
      })
    );
  }

  /** Frees every gradient. */
  zeroGrad(): void {
    for (const p of this.params) {
      p.grad?.dispose();
      p.grad = null;
    }
  }

  /** Frees the momentum buffers. */
  dispose(): void {
    for (const v of this.#velocity) v?.dispose();
    this.#velocity = this.params.map(() => null);
  }
}
