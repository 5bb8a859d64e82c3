/**
 * Every pipeline the library could build on five adapters, built on Dawn's
 * null backend presenting as each (tests/helpers/every_pipeline.ts): NVIDIA H100,
 * AMD RDNA3, Intel Xe2, Apple M3 and lavapipe, as `KNOWN_ADAPTERS` describes
 * them. Nothing executes; each pipeline goes through Tint and Dawn's
 * pipeline rules, so a WGSL or pipeline error that only one adapter's shapes
 * (its subgroup-matrix configs, subgroup sizes, limits) provoke fails here,
 * naming the kernel, its config and the adapter, instead of being timed as
 * Infinity and passed over by the tuner on the user's GPU.
 *
 * Also checked: the subgroup-matrix kernels use one of the adapter's shapes
 * and pin their subgroup size exactly where the adapter lets them; every
 * kernel family a loaded module defines is built on some adapter, and all of
 * them on each GPU with an f16→f32 config; every family with a dtype is built
 * in f32, f16 and bf16 (the subgroup-matrix ones take f16 only).
 */
import assert from "node:assert/strict";
import { KNOWN_ADAPTERS } from "../../../gpu/mod.ts";
import { compileEveryPipeline, type CompileReport } from "../../helpers/every_pipeline.ts";
import { definedKernels } from "../../../gpu/device/kernel.ts";

const reports = new Map<string, CompileReport>();

/** The families that multiply subgroup matrices (f16 only, and only with an f16→f32 config). */
const MATRIX_FAMILY = /subgroup_matrix/;

for (const description of Object.values(KNOWN_ADAPTERS)) {
  Deno.test(`every pipeline compiles for ${description.name} (Dawn's null backend)`, async () => {
    const started = performance.now();
    const report = await compileEveryPipeline(description);
    reports.set(description.name, report);
    const count = (o: string) => report.pipelines.filter((p) => p.outcome === o).length;
    console.log(
      `${description.name}: ${report.pipelines.length} pipelines (${count("ok")} compiled, ` +
        `${count("beyond-null")} past the null device's own limits but within the adapter's), ` +
        `${report.tilings} matmul tilings, ${report.plans} attention plans, ` +
        `${((performance.now() - started) / 1000).toFixed(1)} s`,
    );
    const failed = report.pipelines.filter((p) => p.outcome === "failed");
    assert.deepEqual(
      failed.map((p) => `${description.name}: ${p.message}`),
      [],
      `${failed.length} pipelines fail on ${description.name}`,
    );
    assert.ok(
      report.pipelines.length >= 500,
      `hundreds of pipelines, not ${report.pipelines.length}`,
    );

    // Subgroup-matrix kernels: the adapter's own shapes, pinned where it lets them.
    const shapes = description.info.subgroupMatrixConfigs
      .filter((c) => c.componentType === "f16" && c.resultComponentType === "f32")
      .map((c) => `${c.M}x${c.N}x${c.K}`);
    const pins = description.features.includes("subgroup-size-control");
    const matrices = report.pipelines.filter((p) => MATRIX_FAMILY.test(p.key));
    for (const { key } of matrices) {
      const field = (name: string) => key.match(new RegExp(`[{,]${name}=(\\w+)`))?.[1];
      assert.ok(
        shapes.includes(`${field("sm")}x${field("sn")}x${field("sk")}`),
        `${key} uses a shape ${description.name} does not list (${shapes.join(", ")})`,
      );
      assert.equal(field("pin"), String(pins), `${key}: pins its subgroup size iff it can`);
      assert.equal(field("sg"), String(description.info.subgroupMaxSize), key);
    }
    if (shapes.length > 0) {
      for (const family of ["matmul", "conv2d", "flash_attention"]) {
        assert.ok(
          matrices.some((p) => p.key.startsWith(`${family}_subgroup_matrix`)),
          `${family} builds subgroup-matrix kernels on ${description.name}`,
        );
      }
    } else assert.equal(matrices.length, 0, "no subgroup-matrix kernel without an f16→f32 config");

    // A GPU with subgroup matrices builds every family; each family in every dtype it takes.
    if (!description.info.isFallbackAdapter && shapes.length > 0) {
      assert.deepEqual(report.unbuilt, [], `families never built on ${description.name}`);
    }
    for (const [family, dtypes] of report.families) {
      if (dtypes.has("-")) continue; // no dtype in its config
      const expected = MATRIX_FAMILY.test(family) ? ["f16"] : ["bf16", "f16", "f32"];
      assert.deepEqual([...dtypes].sort(), expected, `${family}'s dtypes on ${description.name}`);
    }
  });
}

Deno.test("every kernel family is built on some adapter", () => {
  assert.equal(reports.size, Object.keys(KNOWN_ADAPTERS).length, "every adapter's test ran first");
  const built = new Set([...reports.values()].flatMap((r) => [...r.families.keys()]));
  const unbuilt = definedKernels().map((d) => d.name).filter((name) => !built.has(name));
  assert.deepEqual(unbuilt, []);
  console.log(
    `${built.size} kernel families; pipelines per adapter: ` +
      [...reports.values()].map((r) => `${r.adapter} ${r.pipelines.length}`).join(", "),
  );
});
