/**
 * The seam through which automatic mixed precision reaches the ops. `gpu/`
 * knows nothing of policies: each op that consults autocast hands its inputs
 * to `autocastInputs(op, inputs)`, which returns them unchanged unless a hook
 * is installed in the runtime state (amp's `autocast()` installs one).
 */
import type { AutocastOpName } from "./op_registry.ts";
import { runtime, withState } from "./runtime_state.ts";
import type { Tensor } from "./tensor.ts";

/**
 * Returns the inputs an op should use, cast as the active policy says. It is
 * given every tensor input (i32 ids included) and must return them in order.
 */
export type CastHook = (op: AutocastOpName, inputs: readonly Tensor[]) => Tensor[];

/** The inputs of `op` as the active autocast policy wants them (unchanged without one). */
export function autocastInputs(op: AutocastOpName, inputs: readonly Tensor[]): readonly Tensor[] {
  const hook = runtime.castHook;
  if (hook === null) return inputs;
  // The hook's own casts must not be autocast again.
  return withState({ castHook: null }, () => hook(op, inputs));
}
