/** Helpers of the fused attention tests: forcing a plan, and the dropout mask's factors. */
import { type AttentionPlan, DTYPES, type RandomRange, randomUniform } from "../gpu/mod.ts";
import { gpu } from "./_gpu.ts";
import { attentionSettings } from "../gpu/kernels/attention/settings.ts";

/**
 * Runs `fn` with each dtype's attention plan set to `plan` and no per-shape
 * picks, then restores the tuned ones.
 */
export async function withPlan(plan: AttentionPlan, fn: () => Promise<void>): Promise<void> {
  const { plans, shapes } = attentionSettings.of(gpu);
  const tuned = new Map(plans), picks = new Map(shapes.picks);
  try {
    for (const dtype of DTYPES) plans.set(dtype, plan);
    shapes.picks.clear();
    await fn();
  } finally {
    plans.clear();
    shapes.picks.clear();
    for (const [dtype, p] of tuned) plans.set(dtype, p);
    for (const [key, p] of picks) shapes.picks.set(key, p);
  }
}

/** The dropout factor of weight (z, i, j), from the mask's definition (see gpu/tensor/random.ts). */
export function dropoutFactor(
  p: number,
  range: RandomRange,
  t: number,
): (z: number, i: number, j: number) => number {
  return (z, i, j) =>
    randomUniform(range.key, range.counter + (z * t + i) * t + j) >= p ? 1 / (1 - p) : 0;
}
