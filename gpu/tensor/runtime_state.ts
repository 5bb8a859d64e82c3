/**
 * The runtime's state, in one object (TensorFlow.js's `EngineState` is the
 * model): the modes that change how ops behave (grad recording, the autocast
 * hook, the checkpoint recompute flag, tidy tracking, the random-number tape,
 * the op observer) and the open tidy scopes beside them. The two seams through
 * which layers above reach the ops — the cast hook and the op observer — are
 * declared here, with their slots.
 *
 * Modes change only through {@link withState}, which restores them when its
 * function returns or throws; gradient checkpointing snapshots the modes of
 * the first run ({@link currentModes}) and recomputes under the same ones.
 * State that is not a mode lives with its owner: the default device with
 * `Gpu` (device/gpu.ts), tuner settings per device (tuning/settings.ts),
 * warnings shown (base/warn_once.ts).
 */
import type { DType } from "../base/dtype.ts";
import type { AutocastOpName, OpName } from "../base/op_registry.ts";
import type { RandomRange } from "../kernels/wgsl/random.ts";
import type { GradNode, Tensor } from "./tensor.ts";

/**
 * The autocast seam: returns the inputs an op should use, cast as the active
 * policy says. It is given every tensor input (i32 ids included) and must
 * return them in order. A hook may also say, through `dtypes`, which dtypes
 * it would give inputs of the given dtypes without casting anything: ops use
 * that to write their output in the dtype its consumer wants, or to read a
 * mixed f16/f32 pair in one kernel, instead of casting in a dispatch of its
 * own. amp's `autocast()` installs one; ops ask it through autocast_hook.ts.
 */
export type CastHook = ((op: AutocastOpName, inputs: readonly Tensor[]) => Tensor[]) & {
  dtypes?: (op: AutocastOpName, dtypes: readonly DType[]) => DType[];
};

/**
 * The seam through which a numerics inspector sees every op, as the cast hook
 * is the seam of autocast: `record` hands each op's output to the observer
 * installed with `withState({ opObserver })`, and the backward pass hands it
 * each gradient a rule produces. gpu/ knows nothing of what the observer does
 * (amp's `NumericsInspector` accumulates statistics on the GPU); without one,
 * the cost is a null check per op.
 */
export interface OpObserver {
  /**
   * `op` produced `output` from `inputs` (forward); `node` is the tape node
   * it recorded, or null when nothing was recorded (grad mode off).
   */
  forward(op: OpName, inputs: readonly Tensor[], output: Tensor, node: GradNode | null): void;
  /** During backward, the rule of `node` produced `grad` for `node.inputs[index]`. */
  backward(node: GradNode, index: number, grad: Tensor): void;
}

/**
 * What the random-number tape slot holds (random.ts's `RandomTape`): it notes
 * each draw of a generator while a region runs, and answers the same draws
 * when the region is recomputed.
 */
export interface RandomDraws {
  /** The recorded answer to a draw while replaying, else undefined. */
  answer(generator: object, count: number): RandomRange | undefined;
  /** A draw while recording. */
  noteDraw(generator: object, count: number, range: RandomRange): void;
}

/**
 * The capture seam: what a captured step's recording notes besides its GPU
 * commands (those the command batch records itself). A replay runs no
 * JavaScript of the step, so whatever the step decided on the host from
 * per-step state must be noted here to be done again before each replay.
 */
export interface StepRecorder {
  /**
   * `generator` gave `range` for `count` numbers (a dropout mask): a replay
   * draws again from it, and the dispatches that read `range` (through
   * their live uniforms) see the new numbers, as an eager step would.
   */
  noteDraw(
    generator: { take(count: number): RandomRange },
    count: number,
    range: RandomRange,
  ): void;
  /**
   * A decision made from per-step host data (the range of a batch's ids):
   * run again before each replay; it throws as the op would (a bad id), or
   * returns why the recorded commands no longer fit (a re-capture), or null.
   */
  noteCheck(check: () => string | null): void;
}

/** What a tidy scope tracks: anything with an idempotent `dispose()`. */
export interface ScopedResource {
  /** Frees the resource; calling it twice is harmless. */
  dispose(): void;
}

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
  randomTape: RandomDraws | null;
  /** Sees every op's output and every gradient (a numerics inspector); null: none. */
  opObserver: OpObserver | null;
  /** Notes what a captured step decides on the host while it records; null: none. */
  stepRecorder: StepRecorder | null;
}

/** The whole state: the modes and the bookkeeping beside them. */
export interface RuntimeState extends RuntimeModes {
  /** Open `tidy` scopes, innermost last. */
  readonly scopes: Set<ScopedResource>[];
}

/** The one runtime state of this JavaScript realm. */
export const runtime: RuntimeState = {
  gradEnabled: true,
  castHook: null,
  recomputing: false,
  tracking: true,
  randomTape: null,
  opObserver: null,
  stepRecorder: null,
  scopes: [],
};

/** A copy of the current modes, to re-enter later with {@link withState}. */
export function currentModes(): RuntimeModes {
  const { gradEnabled, castHook, recomputing, tracking, randomTape, opObserver, stepRecorder } =
    runtime;
  return { gradEnabled, castHook, recomputing, tracking, randomTape, opObserver, stepRecorder };
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
