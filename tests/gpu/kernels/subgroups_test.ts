/**
 * The `subgroups` device feature: asked for whatever `adapter.features`
 * lists (Deno leaves it out but grants it), reported as `gpu.subgroups`, in
 * the adapter profile, and forced off by `initGpu({ subgroups: false })`.
 */
import assert from "node:assert/strict";
import { initGpu, ValueError } from "../../../gpu/mod.ts";
import { gpuLikeProfile } from "../../helpers/internals.ts";
import { useSubgroups } from "../../../gpu/kernels/wgsl/subgroups.ts";
import { withSubgroupsDirective } from "../../helpers/internals.ts";
import { reduceKernel } from "../../../gpu/kernels/reduce.ts";
import { asGpu, gpu, GPU_TEST } from "../../helpers/gpu.ts";

Deno.test({
  name: "subgroups: granted as the device says, in the profile, off on CPU adapters' kernels",
  ...GPU_TEST,
  async fn() {
    assert.equal(gpu.subgroups, gpu.device.features.has("subgroups"));
    assert.equal(gpu.adapterProfile.subgroups, gpu.subgroups);
    // lavapipe keeps today's kernels; run as a GPU it takes the subgroup ones when granted.
    if (gpu.adapterProfile.cpu) assert.equal(useSubgroups(gpu), false);
    await asGpu(() => {
      assert.equal(gpuLikeProfile(gpu).subgroups, gpu.subgroups);
      assert.equal(useSubgroups(gpu), gpu.subgroups);
      return Promise.resolve();
    });
  },
});

Deno.test({
  name: "subgroups: initGpu({ subgroups: false }) forces the fallback; a bad value is refused",
  ...GPU_TEST,
  async fn() {
    const off = await initGpu({ matmulTiling: "default", subgroups: false, setDefault: false });
    try {
      assert.equal(off.subgroups, false);
      assert.equal(off.device.features.has("subgroups"), false);
      assert.equal(off.adapterProfile.subgroups, false);
      assert.equal(off.subgroupsDirective, false);
    } finally {
      off.destroy();
    }
    await assert.rejects(
      // deno-lint-ignore no-explicit-any
      () => initGpu({ subgroups: "yes" as any }),
      (e: Error) => e instanceof ValueError && /subgroups must be true or false/.test(e.message),
    );
  },
});

Deno.test("subgroups: `enable subgroups;` leads a kernel that uses them where the device wants it", () => {
  const config = { op: "sum", dtype: "f16", out: "f32" } as const;
  for (const directive of [false, true]) {
    const withSubgroups = withSubgroupsDirective(
      reduceKernel.wgsl({ ...config, layout: "subgroup" }),
      directive,
    );
    assert.equal(withSubgroups.startsWith("enable subgroups;\nenable f16;"), directive);
    assert.ok(withSubgroups.includes("subgroupAdd("));
    // Kernels without subgroup builtins never carry it.
    const without = reduceKernel.wgsl({ ...config, layout: "workgroup" });
    assert.ok(!withSubgroupsDirective(without, directive).includes("subgroups"));
  }
  // Deno's naga rejects the line, Dawn's Tint requires it: the probe tells them apart.
  assert.equal(gpu.subgroupsDirective, gpu.backend === "dawn" && gpu.subgroups);
});
