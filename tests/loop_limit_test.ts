import assert from "node:assert/strict";
import { fusedCausalAttention, linear, matmul, Tensor, tidy } from "../mod.ts";
import { gpu, GPU_TEST } from "./_gpu.ts";

Deno.test({
  name: "loop cap: on lavapipe a product splits a reduction too long for one invocation; " +
    "what cannot split is a clear error",
  ...GPU_TEST,
  async fn() {
    const k = 70001, ones = Tensor.full([2, k], 1);
    const chosen = gpu.splitKWorkgroups;
    try {
      // Split for the cap alone (0: no split to fill the device) and by default: every term counts.
      for (const workgroups of [0, chosen]) {
        gpu.splitKWorkgroups = workgroups;
        const c = matmul(ones, ones, { transB: true });
        assert.deepEqual([...await c.read()], [k, k, k, k], `splitKWorkgroups ${workgroups}`);
        c.dispose();
      }
    } finally {
      gpu.splitKWorkgroups = chosen;
    }
    if (gpu.loopIterationLimit === Infinity) {
      ones.dispose();
      return;
    }
    tidy(() => {
      // A bias or activation acts on whole sums, so such a product is not split.
      const bias = Tensor.zeros([2]);
      assert.throws(
        () => linear(ones, ones, { bias }),
        /matmul: a reduction over K = 70001 takes about 70001 loop iterations in one shader invocation, and this adapter \(llvmpipe.*\) stops an invocation after 65535/,
      );
      const q = Tensor.zeros([1, 2048, 256]);
      assert.throws(
        () => fusedCausalAttention(q, q, q, { heads: 1 }),
        /fusedCausalAttention: attention over T = 2048 with head size 256 takes about .* Use shorter sequences/,
      );
    });
    ones.dispose();
  },
});
