/** Sequential: modules applied one after another. */
import type { Tensor } from "../gpu/tensor.ts";
import { Module } from "./module.ts";

/**
 * Applies its layers in order; they are named "0", "1", ... so parameters
 * read `0.weight`, `2.bias`, as in PyTorch.
 *
 * @example
 * ```ts ignore
 * const mlp = new Sequential(new Linear(784, 256), new ReLU(), new Linear(256, 10));
 * const logits = mlp.forward(x);
 * ```
 */
export class Sequential extends Module {
  /** The layers, in order. */
  readonly layers: readonly Module[];

  /** A sequence of `layers`. */
  constructor(...layers: Module[]) {
    super();
    this.layers = layers.map((layer, i) => this.registerModule(String(i), layer));
  }

  /** Runs every layer in turn. */
  forward(x: Tensor): Tensor {
    let h = x;
    for (const layer of this.layers) h = layer.forward(h);
    return h;
  }
}
