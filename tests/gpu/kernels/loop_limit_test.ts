import assert from "node:assert/strict";
import { fusedCausalAttention, linear, matmul, Tensor, tidy } from "../../../mod.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { matmulSettings } from "../../../gpu/kernels/gemm/settings.ts";

Deno.test({
  name: "loop cap: a product splits a reduction too long for one invocation on a capped adapter",
  ...GPU_TEST,
  async fn() {
    const k = 70001, ones = Tensor.full([2, k], 1);
    const settings = matmulSettings.of(gpu), chosen = settings.splitKWorkgroups;
    try {
      // Split for the cap alone (0: no split to fill the device) and by default: every term counts.
      for (const workgroups of [0, chosen]) {
        settings.splitKWorkgroups = workgroups;
        const c = matmul(ones, ones, { transB: true });
        assert.deepEqual([...await c.read()], [k, k, k, k], `splitKWorkgroups ${workgroups}`);
        c.dispose();
      }
    } finally {
      settings.splitKWorkgroups = chosen;
      ones.dispose();
    }
  },
});

// Only adapters that stop long loops (lavapipe) have these errors: elsewhere the test
// shows as ignored rather than passing without a check.
const capped = gpu.loopIterationLimit !== Infinity;

Deno.test({
  name: "loop cap: what cannot split is a clear error" +
    (capped ? "" : " (ignored: this adapter has no loop cap)"),
  ignore: !capped,
  ...GPU_TEST,
  fn() {
    tidy(() => {
      // A bias or activation acts on whole sums, so such a product is not split.
      const ones = Tensor.full([2, 70001], 1), bias = Tensor.zeros([2]);
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
  },
});
