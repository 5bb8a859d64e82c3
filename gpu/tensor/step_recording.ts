/**
 * Recording one run of a step for capture, at the tensor level: while
 * {@link recordStep} runs the step (eagerly: its work happens), the command
 * batch notes every command (device/command_recording.ts), the pool keeps
 * every buffer the step takes in the capture's reserve (device/buffer_pool.ts),
 * and the runtime's `stepRecorder` slot notes what the step decided on the
 * host from per-step state: the random ranges it drew (dropout masks) and
 * the checks made on a batch's data (the range of its ids). Before each
 * replay, {@link recheckStep} runs those checks on the new batch and
 * {@link redrawStep} draws the ranges again, so the replay sees what an
 * eager step would.
 */
import { fail, StateError } from "../base/errors.ts";
import type { Gpu } from "../device/gpu.ts";
import type { PoolReserve } from "../device/buffer_pool.ts";
import { CommandRecording } from "../device/command_recording.ts";
import type { RandomRange } from "../kernels/wgsl/random.ts";
import { runtime, type StepRecorder, withState } from "./runtime_state.ts";

/** A random draw a recorded step made. */
export interface StepDraw {
  /** The generator drawn from. */
  readonly generator: { take(count: number): RandomRange };
  /** How many numbers. */
  readonly count: number;
  /** The range it gave, refilled at each replay (the dispatches read it). */
  readonly range: RandomRange;
}

/** Everything one recorded run of a step noted. */
export class StepRecording implements StepRecorder {
  /** Its GPU commands. */
  readonly commands: CommandRecording = new CommandRecording();
  /** Its random draws, in order. */
  readonly draws: StepDraw[] = [];
  /** Its checks on per-step data, in order. */
  readonly checks: (() => string | null)[] = [];

  /** @internal */
  noteDraw(generator: StepDraw["generator"], count: number, range: RandomRange): void {
    this.draws.push({ generator, count, range });
  }

  /** @internal */
  noteCheck(check: () => string | null): void {
    this.checks.push(check);
  }
}

/**
 * Notes, when a captured step is recording, a decision made from per-step
 * host state: `check` runs again before each replay and throws as the op
 * would, or returns why the recorded commands no longer fit (the step is
 * then captured again), or null. Nothing happens outside a recording.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { noteCaptureCheck } from "./step_recording.ts";
 * let momentum = 0.9;
 * const recorded = momentum > 0;
 * // In an optimizer: a step with momentum is a different kernel than one without.
 * noteCaptureCheck(() => (momentum > 0) === recorded ? null : "momentum was turned on or off");
 * momentum = 0;
 * assert.equal(momentum, 0); // outside a recording the check was not kept
 * ```
 */
export function noteCaptureCheck(check: () => string | null): void {
  runtime.stepRecorder?.noteCheck(check);
}

/**
 * Runs `step` eagerly on `gpu` while `recording` notes what it does and the
 * pool keeps the buffers it takes in `reserve`. Recordings do not nest.
 */
export function recordStep<T>(
  gpu: Gpu,
  reserve: PoolReserve,
  recording: StepRecording,
  step: () => T,
): T {
  if (gpu.batch.recorder !== null || runtime.stepRecorder !== null) {
    fail(StateError, "capture", "a captured step cannot run while another one records.");
  }
  gpu.batch.recorder = recording.commands;
  gpu.pool.activeReserve = reserve;
  try {
    return withState({ stepRecorder: recording }, step);
  } finally {
    gpu.batch.recorder = null;
    gpu.pool.activeReserve = null;
  }
}

/**
 * Runs the recorded step's checks on the state now (a new batch's ids):
 * throws as the op would, or returns the first reason its commands no
 * longer fit, or null.
 */
export function recheckStep(recording: StepRecording): string | null {
  for (const check of recording.checks) {
    const why = check();
    if (why !== null) return why;
  }
  return null;
}

/**
 * Draws again, in order, what the recorded step drew, refilling each
 * recorded range: the generators move on as an eager step would move them,
 * and the dispatches that read those ranges see the new numbers.
 */
export function redrawStep(recording: StepRecording): void {
  for (const d of recording.draws) {
    const fresh = d.generator.take(d.count);
    d.range.key = fresh.key;
    d.range.counter = fresh.counter;
  }
}
