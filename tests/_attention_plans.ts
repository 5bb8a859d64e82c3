/** Helpers of the fused attention tests: forcing a plan, and the dropout mask's factors. */
import { type AttentionPlan, type RandomRange, randomUniform } from "../gpu/mod.ts";
import { gpu } from "./_gpu.ts";

/** Runs `fn` with each dtype's attention plan set to `plan`, then restores the tuned ones. */
export async function withPlan(plan: AttentionPlan, fn: () => Promise<void>): Promise<void> {
  const tuned = new Map(gpu.attentionPlans);
  try {
    for (const dtype of ["f32", "f16"]) gpu.attentionPlans.set(dtype, plan);
    await fn();
  } finally {
    gpu.attentionPlans.clear();
    for (const [dtype, p] of tuned) gpu.attentionPlans.set(dtype, p);
  }
}

/** The dropout factor of weight (z, i, j), from the mask's definition (see gpu/random.ts). */
export function dropoutFactor(
  p: number,
  range: RandomRange,
  t: number,
): (z: number, i: number, j: number) => number {
  return (z, i, j) =>
    randomUniform(range.key, range.counter + (z * t + i) * t + j) >= p ? 1 / (1 - p) : 0;
}
