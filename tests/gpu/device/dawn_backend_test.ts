/**
 * The Dawn backend (docs/dawn.md): chosen by `initGpu({ backend })` or
 * `HALFSTEP_BACKEND`, its device and subgroup-matrix configs reported as plain
 * data, and every way it can be missing or broken is one `GpuError` line that
 * says what to install. The tests that need Dawn itself run when the suite
 * runs on it (`HALFSTEP_BACKEND=dawn` with Mesa 26's lavapipe, as CI's second
 * pass does) and are ignored, saying so, on the builtin backend.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { BACKENDS, initGpu, SUBGROUP_MATRIX_FEATURE, ValueError } from "../../../gpu/mod.ts";
import { ROOT } from "../../helpers/bundle.ts";
import { events, MNIST, run } from "../../helpers/examples.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";

const ON_DAWN = gpu.backend === "dawn";
const NEEDS_DAWN = ON_DAWN ? "" : " (ignored: the suite runs on the builtin backend)";

/** `deno run` with `flags` and `env` of `code`, which may use `mod` (halfstep's mod.ts). */
async function runHalfstep(code: string, flags: string[], env: Record<string, string>) {
  const mod = join(ROOT, "mod.ts");
  const script = await Deno.makeTempFile({ suffix: ".ts" });
  try {
    await Deno.writeTextFile(script, `import * as mod from ${JSON.stringify(mod)};\n${code}`);
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", ...flags, script],
      env: { NO_COLOR: "1", ...env },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = (b: Uint8Array) => new TextDecoder().decode(b);
    return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
  } finally {
    await Deno.remove(script);
  }
}

/** The error lines of a failed run (Dawn's own warnings and the stack left out). */
function errorLine(stderr: string): string {
  return stderr.split("\n").filter((l) => l.startsWith("error:")).join("\n");
}

/** Starts Dawn's device in a subprocess and prints what it reports. */
const START_DAWN = `const gpu = await mod.initGpu({ backend: "dawn", matmulTiling: "default" });
console.log(JSON.stringify({ backend: gpu.backend, configs: gpu.subgroupMatrixConfigs }));
gpu.destroy();`;

Deno.test("backends: initGpu's backend option and HALFSTEP_BACKEND take builtin, dawn or dawn-null only", async () => {
  assert.deepEqual(BACKENDS, ["builtin", "dawn", "dawn-null"]);
  await assert.rejects(
    // deno-lint-ignore no-explicit-any
    () => initGpu({ backend: "vulkan" as any, setDefault: false }),
    (e: Error) =>
      e instanceof ValueError &&
      /backend must be "builtin", "dawn" or "dawn-null", not "vulkan"/.test(e.message),
  );
  const bad = await runHalfstep("await mod.initGpu();", ["-A"], { HALFSTEP_BACKEND: "metal" });
  assert.notEqual(bad.code, 0);
  assert.match(
    errorLine(bad.stderr),
    /ValueError: initGpu: HALFSTEP_BACKEND must be "builtin", "dawn" or "dawn-null", not "metal"$/,
  );
});

Deno.test("backends: a Dawn that cannot load is one GpuError line that says what to do", async () => {
  const noFfi = await runHalfstep(START_DAWN, ["--allow-read", "--allow-env"], {});
  assert.match(
    errorLine(noFfi.stderr),
    /^error: Uncaught \(in promise\) GpuError: initGpu: Dawn is a native library \(Node-API\): run Deno with --allow-ffi \(or -A\) to use it\.$/,
  );
  const missing = "/nonexistent/dawn.node";
  const wrong = await runHalfstep(START_DAWN, ["-A"], { HALFSTEP_DAWN_NODE: missing });
  assert.notEqual(wrong.code, 0);
  const line = errorLine(wrong.stderr);
  assert.equal(line.split("\n").length, 1, line);
  assert.match(
    line,
    /GpuError: initGpu: Dawn could not be loaded from HALFSTEP_DAWN_NODE=\/nonexistent\/dawn\.node \(/,
  );
  assert.match(
    line,
    /Install it with npm's registry reachable .*npm:webgpu@0\.6\.2.*docs\/dawn\.md\)\.$/,
  );
});

Deno.test("backends: Dawn with a Vulkan driver it refuses (here none) is one line naming Mesa 26", async () => {
  const none = await runHalfstep(START_DAWN, ["-A"], { VK_DRIVER_FILES: "/nonexistent.json" });
  assert.notEqual(none.code, 0);
  assert.match(
    errorLine(none.stderr),
    /GpuError: initGpu: no WebGPU adapter was found\. Dawn found no Vulkan adapter it accepts\. .*Mesa 26's lavapipe .*docs\/dawn\.md\.$/,
  );
});

Deno.test({
  name: "backends: Dawn's device has subgroups, f16, timestamps and subgroup matrices, whose " +
    "configs are plain data in gpu and in the adapter profile" + NEEDS_DAWN,
  ignore: !ON_DAWN,
  ...GPU_TEST,
  fn() {
    assert.equal(gpu.backend, "dawn");
    for (const feature of ["subgroups", "shader-f16", "timestamp-query", SUBGROUP_MATRIX_FEATURE]) {
      assert.ok(gpu.device.features.has(feature as GPUFeatureName), `${feature} requested`);
    }
    // Tint requires `enable subgroups;`: the probe found that out.
    assert.equal(gpu.subgroupsDirective, true);
    const configs = gpu.subgroupMatrixConfigs;
    assert.ok(configs.length > 0);
    for (const c of configs) {
      const fields = [
        "componentType",
        "resultComponentType",
        "M",
        "N",
        "K",
        "subgroupSize",
        "subgroupSizing",
      ];
      assert.deepEqual(Object.keys(c), fields);
      const sizes = [c.M, c.N, c.K, c.subgroupSize];
      assert.ok(sizes.every((n) => Number.isInteger(n) && n > 0), JSON.stringify(c));
    }
    // Plain objects: JSON keeps every field (Dawn's native objects print as {}).
    assert.deepEqual(JSON.parse(JSON.stringify(configs)), configs);
    assert.deepEqual(gpu.adapterProfile.subgroupMatrixConfigs, configs);
    if (/llvmpipe/.test(gpu.adapterName)) {
      // Mesa 26's lavapipe, as measured (DESIGN.md): four configs, 8×8×8, subgroups of 8.
      const shapes = configs.map((c) =>
        `${c.componentType}>${c.resultComponentType} ${c.M}x${c.N}x${c.K}`
      );
      assert.deepEqual(shapes, ["f16>f16 8x8x8", "f16>f32 8x8x8", "u8>u32 8x8x8", "i8>i32 8x8x8"]);
      assert.equal(gpu.adapterProfile.subgroupSize, 8);
      assert.ok(configs.every((c) => c.subgroupSize === 8));
    }
  },
});

Deno.test({
  name: "backends: Dawn loads from npm and from HALFSTEP_DAWN_NODE alike; subgroups: false " +
    "asks for no subgroup matrices either" + NEEDS_DAWN,
  ignore: !ON_DAWN,
  ...GPU_TEST,
  async fn() {
    // The binary the npm package installed (deno.json: nodeModulesDir "auto"), loaded as a file
    // with npm off, as on a machine without a registry.
    const file = join(
      ROOT,
      "node_modules/.deno/webgpu@0.6.2/node_modules/webgpu/dist/linux-x64/dawn.node",
    );
    for (
      const [flags, env] of [
        [["-A"], { HALFSTEP_DAWN_NODE: "" }], // empty: the npm package
        [["-A", "--no-npm"], { HALFSTEP_DAWN_NODE: file }],
      ] as const
    ) {
      const run = await runHalfstep(START_DAWN, [...flags], env);
      assert.equal(run.code, 0, run.stderr);
      const started = JSON.parse(run.stdout);
      assert.equal(started.backend, "dawn");
      assert.deepEqual(started.configs, gpu.subgroupMatrixConfigs, JSON.stringify(env));
    }
    const plain = await initGpu({
      backend: "dawn",
      subgroups: false,
      matmulTiling: "default",
      setDefault: false,
    });
    try {
      assert.equal(plain.subgroups, false);
      assert.equal(plain.device.features.has(SUBGROUP_MATRIX_FEATURE), false);
      assert.deepEqual(plain.subgroupMatrixConfigs, []);
    } finally {
      plain.destroy();
    }
  },
});

Deno.test({
  name: "backends: examples/mnist.ts --amp --backend dawn trains, and says it runs on Dawn" +
    NEEDS_DAWN,
  ignore: !ON_DAWN,
  async fn() {
    const args = ["--amp", "--backend", "dawn", "--limit", "1024", "--epochs", "1", "--json"];
    // The README's permissions, and Dawn's --allow-ffi.
    const trained = await run(MNIST, args, false, ["--allow-read", "--allow-env", "--allow-ffi"]);
    assert.equal(trained.code, 0, trained.stderr);
    const all = events(trained.stdout);
    const start = all.find((e) => e.event === "start")!, final = all.at(-1)!;
    assert.equal(start.backend, "dawn");
    assert.deepEqual(start.subgroupMatrixConfigs, gpu.subgroupMatrixConfigs);
    assert.equal(final.event, "final");
    assert.equal(final.skippedSteps, 0);
    // 8 steps of 128 images: far above chance (10%) on the 10000 test images.
    assert.ok((final.testAccuracy as number) > 0.5, `test accuracy ${final.testAccuracy}`);
  },
});
