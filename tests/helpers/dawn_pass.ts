/**
 * The subgroup-matrix (tensor-core) test files run on CI's Dawn pass, and
 * ignore their tests where the device has no subgroup-matrix config (the
 * builtin backend never has one). On the Dawn pass itself an adapter without
 * configs used to make those files pass with every test ignored (issue 47):
 * each now registers, with {@link requireMatricesOnDawn}, one test that
 * fails there.
 */
import assert from "node:assert/strict";
import { gpu } from "./gpu.ts";

/** Whether the suite runs on the Dawn backend (CI's second pass, HALFSTEP_BACKEND=dawn). */
export const ON_DAWN: boolean = gpu.backend === "dawn";

/**
 * Registers the test of `what` (a test file's subject) that fails on the
 * Dawn backend when `hasConfig` is false: there the file's other tests
 * would all be ignored. Ignored on the builtin backend, saying so.
 */
export function requireMatricesOnDawn(what: string, hasConfig: boolean): void {
  Deno.test({
    name: `${what}: on the Dawn pass the adapter has an f16→f32 subgroup-matrix config, so ` +
      `these tests run${ON_DAWN ? "" : " (ignored: the suite runs on the builtin backend)"}`,
    ignore: !ON_DAWN,
    fn() {
      assert.ok(
        hasConfig,
        `${gpu.adapterName} lists no f16→f32 subgroup-matrix config through Dawn, so every ` +
          `${what} test would be ignored: run the Dawn pass on Mesa 26's lavapipe ` +
          "(.ci/lavapipe26.sh) or a GPU whose Vulkan driver has VK_KHR_cooperative_matrix",
      );
    },
  });
}
