/** Differentiable dropout whose mask is regenerated, never stored. */
import { record } from "../tensor/autograd.ts";
import { autocastInputs } from "../tensor/autocast_hook.ts";
import { fail, ValueError } from "../base/errors.ts";
import { launchDropout } from "../kernels/dropout.ts";
import type { RandomRange } from "../kernels/wgsl/random.ts";
import { Tensor } from "../tensor/tensor.ts";

/**
 * Zeroes each element with probability `p` and scales the rest by 1/(1 − p).
 * The mask is a pure function of `range` (see `RandomGenerator.take`): the
 * backward rule regenerates it, so no mask is kept in memory, and running
 * again with the same range reproduces it bit for bit.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { dropout, initGpu, RandomGenerator, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.full([8], 1);
 * const rng = new RandomGenerator(0);
 * const y = dropout(x, 0.5, rng.take(x.size)); // kept values are scaled by 1 / (1 − p)
 * assert.ok((await y.read()).every((v) => v === 0 || v === 2));
 * gpu.destroy();
 * ```
 */
export function dropout(x0: Tensor, p: number, range: RandomRange): Tensor {
  if (!(p >= 0 && p < 1)) {
    fail(ValueError, "dropout", `p must be in [0, 1), got ${p} (input ${x0.describe()}).`);
  }
  const [x] = autocastInputs("dropout", [x0]);
  const y = Tensor.adopt(launchDropout(x, p, range));
  return record({
    op: "dropout",
    inputs: [x],
    output: y,
    backward: (g) => [Tensor.adopt(launchDropout(g, p, range))],
  });
}
