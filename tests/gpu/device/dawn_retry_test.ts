/**
 * A Dawn that failed to load is tried again in the same process (issue 47,
 * tests that can fail III): `dawnGpu()` forgets a failed load, so a script
 * that fixes its install (here: drops a wrong `HALFSTEP_DAWN_NODE`) and
 * calls `initGpu({ backend: "dawn" })` again loads Dawn, instead of being
 * handed the first failure for good. Without a Vulkan driver Dawn accepts
 * (`VK_DRIVER_FILES` pointing nowhere, on either pass), the second call ends
 * at the adapter, past the load.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "../../helpers/bundle.ts";

const RETRY = `
import { initGpu } from ${JSON.stringify(join(ROOT, "mod.ts"))};
const start = () =>
  initGpu({ backend: "dawn", matmulTiling: "default", setDefault: false }).then(
    (gpu) => { gpu.destroy(); return "a device"; },
    (e) => e.message.split("\\n")[0],
  );
Deno.env.set("HALFSTEP_DAWN_NODE", "/nonexistent/dawn.node");
const first = await start();
Deno.env.delete("HALFSTEP_DAWN_NODE");
const second = await start();
console.log(JSON.stringify({ first, second }));
`;

Deno.test("backends: a Dawn load that failed is tried again by the next initGpu in the same process", async () => {
  const script = await Deno.makeTempFile({ suffix: ".ts" });
  try {
    await Deno.writeTextFile(script, RETRY);
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", script],
      env: { NO_COLOR: "1", VK_DRIVER_FILES: "/nonexistent.json" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = (b: Uint8Array) => new TextDecoder().decode(b);
    assert.ok(out.success, text(out.stderr));
    const { first, second } = JSON.parse(text(out.stdout).trim().split("\n").at(-1)!);
    assert.match(
      first,
      /Dawn could not be loaded from HALFSTEP_DAWN_NODE=\/nonexistent\/dawn\.node/,
    );
    assert.doesNotMatch(second, /could not be loaded/, "the second call loaded Dawn");
    assert.match(second, /no WebGPU adapter was found\. Dawn found no Vulkan adapter it accepts/);
  } finally {
    await Deno.remove(script);
  }
});
