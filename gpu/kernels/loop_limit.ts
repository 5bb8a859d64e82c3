/**
 * lavapipe (llvmpipe, the Vulkan CPU driver) stops a shader invocation after
 * 65535 loop iterations in all — every loop of the invocation counts — and
 * carries on with whatever it had: a sum of 70001 ones came out as 65535,
 * silently. Kernels whose per-thread loops grow with the problem (a product's
 * reduction, attention's sequence) check their count here first, so such a
 * problem fails with a clear error on that adapter instead of a wrong result.
 * Other adapters have no such cap.
 */
import type { Gpu } from "../device.ts";
import { fail, ShapeError } from "../errors.ts";

/** Loop iterations one invocation may run on `gpu` (less a margin for fixed loops). */
export function loopIterationLimit(gpu: Gpu): number {
  return /llvmpipe/i.test(gpu.adapterName) ? 65535 - 1024 : Infinity;
}

/**
 * Throws a ShapeError naming `op`, `what` needs `iterations` loop iterations
 * per invocation and `advice`, when that passes the adapter's cap.
 */
export function checkLoopIterations(
  gpu: Gpu,
  iterations: number,
  op: string,
  what: string,
  advice: string,
): void {
  const limit = loopIterationLimit(gpu);
  if (iterations <= limit) return;
  fail(
    ShapeError,
    op,
    `${what} takes about ${Math.ceil(iterations)} loop iterations in one shader invocation, and ` +
      `this adapter (${gpu.adapterName}) stops an invocation after 65535, which would give a ` +
      `silently wrong result. ${advice}`,
  );
}
