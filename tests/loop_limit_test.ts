import assert from "node:assert/strict";
import { fusedCausalAttention, matmul, Tensor, tidy } from "../mod.ts";
import { gpu, GPU_TEST } from "./_gpu.ts";

Deno.test({
  name: "loop cap: on lavapipe a product or attention too long for one invocation is a clear error",
  ...GPU_TEST,
  async fn() {
    if (gpu.loopIterationLimit === Infinity) {
      // No cap on this adapter: the same shapes just run (and give the right sum).
      const ones = Tensor.full([1, 70001], 1);
      assert.equal((await matmul(ones, ones, { transB: true }).read())[0], 70001);
      ones.dispose();
      return;
    }
    tidy(() => {
      const a = Tensor.full([2, 70001], 1), b = Tensor.full([70001, 2], 1);
      assert.throws(
        () => matmul(a, b),
        /matmul: a reduction over K = 70001 takes about 70001 loop iterations in one shader invocation, and this adapter \(llvmpipe.*\) stops an invocation after 65535/,
      );
      const q = Tensor.zeros([1, 2048, 256]);
      assert.throws(
        () => fusedCausalAttention(q, q, q, { heads: 1 }),
        /fusedCausalAttention: attention over T = 2048 with head size 256 takes about .* Use shorter sequences/,
      );
    });
    // Just under the cap still runs, and counts every term.
    const k = 60000, ones = Tensor.full([1, k], 1);
    assert.equal((await matmul(ones, ones, { transB: true }).read())[0], k);
    ones.dispose();
  },
});
