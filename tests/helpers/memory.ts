/**
 * A leak check for training loops: the GPU memory allocated between steps
 * must not change once the loop is warm.
 */
import { AssertionError } from "node:assert/strict";
import type { Gpu } from "../../mod.ts";

/** Options of {@link assertFlatMemory}. */
export interface FlatMemoryOptions {
  /** The device whose buffer pool is read (`gpu.memoryStats().allocatedBytes`). */
  gpu: Gpu;
  /**
   * Runs before measuring (default 2), for what a loop allocates once and
   * keeps: optimizer state, working copies, the loss scaler's buffers.
   */
  warmup?: number;
  /** Measured runs (default 3, at least 2): the bytes after each must be equal. */
  repeats?: number;
  /** What the step is, for the failure message (default "step"). */
  name?: string;
}

/**
 * Runs `step` `warmup` times, then `repeats` times more, reading the bytes
 * allocated on the GPU after each of those, and throws an AssertionError
 * naming them when they are not all equal: something the step allocates
 * outlives it (a tensor never disposed, a tape never freed). Returns the
 * byte counts.
 *
 * A step must end where the loop's state repeats: with gradient accumulation,
 * run every micro-batch of one optimizer step (gradients live between them).
 */
export async function assertFlatMemory(
  step: () => void | Promise<void>,
  options: FlatMemoryOptions,
): Promise<number[]> {
  const { gpu, warmup = 2, repeats = 3, name = "step" } = options;
  if (!Number.isInteger(warmup) || warmup < 0 || !Number.isInteger(repeats) || repeats < 2) {
    throw new RangeError(
      `assertFlatMemory: warmup must be an integer >= 0 and repeats >= 2, got ${warmup} and ${repeats}.`,
    );
  }
  for (let i = 0; i < warmup; i++) await step();
  const bytes: number[] = [];
  for (let i = 0; i < repeats; i++) {
    await step();
    bytes.push(gpu.memoryStats().allocatedBytes);
  }
  if (bytes.some((b) => b !== bytes[0])) {
    const change = bytes[bytes.length - 1] - bytes[0];
    throw new AssertionError({
      message:
        `${name}: the GPU memory allocated after each run changed: ${bytes.join(", ")} bytes ` +
        `(after ${warmup} warm-up runs; ${change >= 0 ? "+" : ""}${change} bytes over ` +
        `${repeats - 1} runs). Something the step allocates outlives it.`,
      actual: bytes,
      expected: bytes.map(() => bytes[0]),
      operator: "deepStrictEqual",
    });
  }
  return bytes;
}
