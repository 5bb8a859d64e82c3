/** Activation layers. */
import { gelu, relu } from "../gpu/ops/elementwise.ts";
import type { Tensor } from "../gpu/tensor.ts";
import { Module } from "./module.ts";

/** max(x, 0). */
export class ReLU extends Module {
  /** Applies ReLU. */
  forward(x: Tensor): Tensor {
    return relu(x);
  }
}

/** GELU (tanh approximation, f32 math inside). */
export class GELU extends Module {
  /** Applies GELU. */
  forward(x: Tensor): Tensor {
    return gelu(x);
  }
}
