/**
 * `initGpu({ deterministic: true })` (issue 47, 4): nothing tuned, no pick
 * read from the per-user cache, refused beside a tuning mode that would
 * tune; the demo's run in that mode is checked against the README's figure
 * from two caches in tests/examples/readme_figure_test.ts.
 */
import assert from "node:assert/strict";
import { initGpu, lazyTuning, matmulSettings, ValueError } from "../../../gpu/mod.ts";
import { shapeState } from "../../../gpu/kernels/gemm/shape_picks.ts";
import { GPU_TEST } from "../../helpers/gpu.ts";

Deno.test({
  name: "initGpu deterministic: tuning off, no cached pick in use, refused with a tuning mode " +
    'or matmulTiling "tune"',
  ...GPU_TEST,
  async fn() {
    for (const options of [{ tuning: "lazy" }, { tuning: "eager" }, { matmulTiling: "tune" }]) {
      await assert.rejects(
        () => initGpu({ deterministic: true, setDefault: false, ...options } as object),
        (e) => e instanceof ValueError && /deterministic/.test(e.message),
        JSON.stringify(options),
      );
    }
    const gpu = await initGpu({ deterministic: true, setDefault: false });
    try {
      assert.equal(lazyTuning.of(gpu).mode, "off", "nothing is tuned at waits");
      assert.equal(matmulSettings.of(gpu).classTilings.size, 0, "no class pick read");
      assert.equal(shapeState(gpu).picks.size, 0, "no shape pick read");
    } finally {
      gpu.destroy();
    }
    // A fixed tiling is deterministic too.
    const fixed = await initGpu({
      deterministic: true,
      matmulTiling: "default",
      setDefault: false,
    });
    fixed.destroy();
  },
});
