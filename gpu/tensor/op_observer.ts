/**
 * The seam through which a numerics inspector sees every op, as the cast hook
 * is the seam of autocast: `record` hands each op's output to the observer
 * installed in the runtime state, and the backward pass hands it each
 * gradient a rule produces. `gpu/` knows nothing of what the observer does
 * (amp's `NumericsInspector` accumulates statistics on the GPU); without one,
 * the cost is a null check per op.
 */
import type { GradNode } from "./autograd.ts";
import type { OpName } from "../base/op_registry.ts";
import type { Tensor } from "./tensor.ts";

/** What the runtime tells an observer installed with `withState({ opObserver })`. */
export interface OpObserver {
  /**
   * `op` produced `output` from `inputs` (forward); `node` is the tape node
   * it recorded, or null when nothing was recorded (grad mode off).
   */
  forward(op: OpName, inputs: readonly Tensor[], output: Tensor, node: GradNode | null): void;
  /** During backward, the rule of `node` produced `grad` for `node.inputs[index]`. */
  backward(node: GradNode, index: number, grad: Tensor): void;
}
