/** Activation layers. */
import { gelu, type GeluOptions, relu, type Tensor, ValueError } from "../gpu/mod.ts";
import { Module } from "./module.ts";

/** max(x, 0). */
export class ReLU extends Module {
  /** Applies ReLU. */
  forward(x: Tensor): Tensor {
    return relu(x);
  }
}

/**
 * GELU with f32 math inside, as `torch.nn.GELU(approximate=...)`: exact
 * (erf) by default, `{ approximate: "tanh" }` for GPT-2's approximation.
 */
export class GELU extends Module {
  /** `"none"` (exact) or `"tanh"`. */
  readonly approximate: "none" | "tanh";

  /** A GELU layer; the option is checked here, not at the first forward. */
  constructor(options: GeluOptions = {}) {
    super();
    this.approximate = options.approximate ?? "none";
    if (this.approximate !== "none" && this.approximate !== "tanh") {
      throw new ValueError(
        `GELU: approximate must be "none" or "tanh", not ${JSON.stringify(options.approximate)}.`,
      );
    }
  }

  /** Applies GELU. */
  forward(x: Tensor): Tensor {
    return gelu(x, { approximate: this.approximate });
  }
}
