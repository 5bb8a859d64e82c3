/**
 * How ops consult the autocast seam. `gpu/` knows nothing of policies: each
 * op that consults autocast hands its inputs to `autocastInputs(op, inputs)`,
 * which returns them unchanged unless a hook (a `CastHook`, declared with its
 * slot in runtime_state.ts) is installed; amp's `autocast()` installs one.
 */
import { type DType, isHalf } from "../base/dtype.ts";
import type { AutocastOpName } from "../base/op_registry.ts";
import { runtime, withState } from "./runtime_state.ts";
import type { Tensor } from "./tensor.ts";

/** The inputs of `op` as the active autocast policy wants them (unchanged without one). */
export function autocastInputs(op: AutocastOpName, inputs: readonly Tensor[]): readonly Tensor[] {
  const hook = runtime.castHook;
  if (hook === null) return inputs;
  // The hook's own casts must not be autocast again.
  return withState({ castHook: null }, () => hook(op, inputs));
}

/**
 * The dtypes the active policy would give `op`'s inputs, without casting
 * them: their own dtypes without a hook, or with a hook that cannot say.
 */
export function autocastDtypes(op: AutocastOpName, inputs: readonly Tensor[]): DType[] {
  const dtypes = inputs.map((t) => t.dtype);
  return runtime.castHook?.dtypes?.(op, dtypes) ?? dtypes;
}

/**
 * {@link autocastInputs} for an op whose kernel reads f16, bf16 and f32 alike
 * and computes in f32: when autocast would only widen half inputs (f16,
 * bf16) to f32, they are passed as they are (the kernel's read widens them,
 * exactly) and no cast is dispatched; `widened` then says the op must compute
 * and write f32 as if its inputs had been cast. Otherwise the inputs are cast
 * as usual.
 */
export function autocastInputsWidenedInKernel(
  op: AutocastOpName,
  inputs: readonly Tensor[],
): { inputs: readonly Tensor[]; widened: boolean } {
  const want = autocastDtypes(op, inputs);
  const widens = (t: Tensor, i: number) => isHalf(t.dtype) && want[i] === "f32";
  if (inputs.some(widens) && inputs.every((t, i) => want[i] === t.dtype || widens(t, i))) {
    return { inputs, widened: true };
  }
  return { inputs: autocastInputs(op, inputs), widened: false };
}

/** The casts autocast made for ops (never the caller's tensors or master weights' working copies). */
const castsForOps = new WeakSet<Tensor>();

/**
 * Marks `t` as a cast an autocast hook made for one op (amp's hook marks each
 * of its casts), so that {@link releaseCasts} may free it after the op.
 */
export function markCastForOp(t: Tensor): Tensor {
  castsForOps.add(t);
  return t;
}

/**
 * Frees the op's handles of the casts autocast made for it, once the op has
 * recorded itself (`record` calls it; the tape keeps its own handle of
 * whatever it saved). An op must not use its casts after `record`. A
 * cast nobody saved — the f32 copy of an f16 residual branch a promoting
 * `add` reads — is then freed at once instead of when the enclosing scope
 * ends: under AMP those were 8C bytes per token and layer of a transformer,
 * alive through all of backward. `output` is never freed; it is returned.
 */
export function releaseCasts(inputs: readonly Tensor[], output: Tensor): Tensor {
  for (const t of inputs) {
    if (castsForOps.has(t) && t !== output && !t.disposed) t.dispose();
  }
  return output;
}
