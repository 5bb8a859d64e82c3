/**
 * lavapipe (llvmpipe, the Vulkan CPU driver) stops a shader invocation after
 * 65535 loop iterations in all — every loop of the invocation counts — and
 * carries on with whatever it had: a sum of 70001 ones came out as 65535,
 * silently. Kernels whose per-thread loops grow with the problem (a product's
 * reduction, attention's sequence) check their count here first, so such a
 * problem fails with a clear error on that adapter instead of a wrong result.
 * Other adapters have no such cap. `Gpu.loopIterationLimit` holds the cap.
 */
import type { Gpu } from "../device/gpu.ts";
import { fail, ShapeError } from "../base/errors.ts";

/**
 * Throws a ShapeError naming `op`, `what` needs `iterations` loop iterations
 * per invocation and `advice`. Callers compare with `gpu.loopIterationLimit`
 * first, so the hot path builds no message.
 */
export function failLoopIterations(
  gpu: Gpu,
  iterations: number,
  op: string,
  what: string,
  advice: string,
): never {
  fail(
    ShapeError,
    op,
    `${what} takes about ${Math.ceil(iterations)} loop iterations in one shader invocation, and ` +
      `this adapter (${gpu.adapterName}) stops an invocation after 65535, which would give a ` +
      `silently wrong result. ${advice}`,
  );
}
