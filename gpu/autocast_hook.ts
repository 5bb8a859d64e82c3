/**
 * The seam through which automatic mixed precision reaches the ops. `gpu/`
 * knows nothing of policies: each op hands its float inputs to
 * `autocastInputs(op, inputs)`, which returns them unchanged unless a hook
 * is installed (the `amp` module installs one inside `autocast()`).
 */
import type { Tensor } from "./tensor.ts";

/** Returns the inputs an op should use, cast as the active policy says. */
export type CastHook = (op: string, inputs: readonly Tensor[]) => Tensor[];

let hook: CastHook | null = null;

/** Installs `next` (null: none) and returns the hook that was active, to restore later. */
export function setCastHook(next: CastHook | null): CastHook | null {
  const previous = hook;
  hook = next;
  return previous;
}

/** The hook now active, or null. */
export function currentCastHook(): CastHook | null {
  return hook;
}

/** The inputs of `op` as the active autocast policy wants them (unchanged without one). */
export function autocastInputs(op: string, inputs: readonly Tensor[]): readonly Tensor[] {
  if (hook === null) return inputs;
  // The hook's own casts must not be autocast again.
  const active = hook;
  hook = null;
  try {
    return active(op, inputs);
  } finally {
    hook = active;
  }
}
