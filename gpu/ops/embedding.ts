/** Differentiable embedding lookup. */
import { DTypeError } from "../base/errors.ts";
import { record } from "../tensor/autograd.ts";
import { autocastInputs } from "../tensor/autocast_hook.ts";
import { launchGather, launchScatterAdd } from "../kernels/embedding.ts";
import { Tensor } from "../tensor/tensor.ts";
import { assertIdsInRange } from "./ids_check.ts";

/**
 * Rows of `table` ([vocab, dim]) selected by the i32 tensor `ids`; the result
 * has shape [...ids.shape, dim]. Ids outside [0, vocab) are a clear error.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { embedding, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const table = Tensor.from([0, 0, 1, 1, 2, 2, 3, 3, 4, 4], [5, 2]); // [vocab, dim]
 * const ids = Tensor.from([3, 1, 4], [3], { dtype: "i32" });
 * const vectors = embedding(table, ids); // [3, dim]
 * assert.equal((await vectors.read()).join(), "3,3,1,1,4,4");
 * gpu.destroy();
 * ```
 */
export function embedding(table0: Tensor, ids: Tensor): Tensor {
  const [table] = autocastInputs("embedding", [table0, ids]);
  if (table.rank !== 2 || ids.dtype !== "i32") {
    throw new DTypeError(
      `embedding: needs a table [vocab, dim] and i32 ids; got table ${table.describe()} ` +
        `and ids ${ids.describe()}. Make ids with Tensor.from(values, shape, { dtype: "i32" }).`,
    );
  }
  assertIdsInRange("embedding", ids, table.shape[0]);
  const out = Tensor.adopt(launchGather(table, ids));
  return record({
    op: "embedding",
    inputs: [table],
    output: out,
    save: [ids],
    backward: (
      g,
      [savedIds],
    ) => [Tensor.adopt(launchScatterAdd(g, savedIds, table.shape, table.dtype))],
  });
}
