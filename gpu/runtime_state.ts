/**
 * The runtime's state, in one object (TensorFlow.js's `EngineState` is the
 * model). Everything that used to be a module-level variable lives here: the
 * modes that change how ops behave (grad recording, the autocast hook, the
 * checkpoint recompute flag, tidy tracking, the random-number tape) and the
 * bookkeeping beside them (open tidy scopes, the default device, warnings
 * already shown).
 *
 * Modes change only through {@link withState}, which restores them when its
 * function returns or throws; gradient checkpointing snapshots the modes of
 * the first run ({@link currentModes}) and recomputes under the same ones.
 */
import type { CastHook } from "./autocast_hook.ts";
import type { Gpu } from "./device.ts";
import type { OpObserver } from "./op_observer.ts";
import type { RandomTape } from "./random.ts";
import type { ScopedResource } from "./scope.ts";

/** The modes ops consult; {@link withState} sets any of them for the length of a call. */
export interface RuntimeModes {
  /** Ops record nodes on the autograd tape (false inside `noGrad`). */
  gradEnabled: boolean;
  /** Asked by every autocast op how to cast its inputs (null: autocast is off). */
  castHook: CastHook | null;
  /** A checkpointed region is being recomputed (BatchNorm leaves its statistics alone). */
  recomputing: boolean;
  /** New tensors join the innermost `tidy` scope (false inside `untracked`). */
  tracking: boolean;
  /** Records (or replays) every random draw, for checkpoint recompute; null when none. */
  randomTape: RandomTape | null;
  /** Sees every op's output and every gradient (a numerics inspector); null: none. */
  opObserver: OpObserver | null;
}

/** The whole state: the modes and the bookkeeping beside them. */
export interface RuntimeState extends RuntimeModes {
  /** Open `tidy` scopes, innermost last. */
  readonly scopes: Set<ScopedResource>[];
  /** The device new tensors use when none is given. */
  defaultGpu: Gpu | null;
  /** Warnings already printed (each is shown once per process). */
  readonly warned: Set<string>;
}

/** The one runtime state of this JavaScript realm. */
export const runtime: RuntimeState = {
  gradEnabled: true,
  castHook: null,
  recomputing: false,
  tracking: true,
  randomTape: null,
  opObserver: null,
  scopes: [],
  defaultGpu: null,
  warned: new Set(),
};

/** A copy of the current modes, to re-enter later with {@link withState}. */
export function currentModes(): RuntimeModes {
  const { gradEnabled, castHook, recomputing, tracking, randomTape, opObserver } = runtime;
  return { gradEnabled, castHook, recomputing, tracking, randomTape, opObserver };
}

/**
 * Runs `fn` with the given modes set and restores the previous ones when it
 * returns or throws. `fn` must be synchronous: modes cannot follow an `await`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { runtime, withState } from "./runtime_state.ts";
 * const inside = withState({ gradEnabled: false }, () => runtime.gradEnabled);
 * assert.equal(inside, false);
 * assert.equal(runtime.gradEnabled, true);
 * ```
 */
export function withState<T>(modes: Partial<RuntimeModes>, fn: () => T): T {
  // Ops call this several times each: save and restore only the modes given.
  const keys = Object.keys(modes) as (keyof RuntimeModes)[];
  const previous = keys.map((key) => runtime[key]);
  Object.assign(runtime, modes);
  try {
    return fn();
  } finally {
    keys.forEach((key, i) => ((runtime as Record<keyof RuntimeModes, unknown>)[key] = previous[i]));
  }
}

/** Prints `message` as a warning the first time it is given, and never again. */
export function warnOnce(message: string): void {
  if (runtime.warned.has(message)) return;
  runtime.warned.add(message);
  console.warn(`[halfstep] ${message}`);
}
