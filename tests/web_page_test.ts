/**
 * The browser demo, end to end: `deno task bundle`, the repository served on
 * 127.0.0.1, and `examples/web/` opened in headless Chromium. Where Chromium
 * has WebGPU (on a machine without a GPU it brings its own software adapter,
 * SwiftShader) the page must train: the loss falls and the accuracy rises.
 * Where it has none, the test says so and still requires that the page loaded
 * the bundle and ran without an error.
 */
import assert from "node:assert/strict";
import { serveDirectory } from "../examples/web/serve.ts";
import { findChromium, launchChromium } from "./_browser.ts";
import { buildBundle, ROOT } from "./_bundle.ts";

const STEPS = 60;

interface DemoState {
  status: "loading" | "training" | "done" | "error" | "no-webgpu";
  adapter: string;
  f16: boolean;
  steps: number;
  losses: { step: number; loss: number }[];
  accuracy: number | null;
  scale: number | null;
  skippedSteps: number | null;
  error: string | null;
}

Deno.test({
  name: "web demo: headless Chromium loads the bundle and trains with live loss",
  sanitizeResources: false, // the browser process and its socket close in finally
  sanitizeOps: false,
  async fn() {
    const chromium = findChromium();
    assert.ok(
      chromium,
      "No Chromium found for the browser test: install Debian's `chromium` " +
        "(apt-get install chromium) or set HALFSTEP_CHROMIUM to a Chrome/Chromium binary.",
    );
    await buildBundle();
    const server = serveDirectory(ROOT);
    const page = await launchChromium(chromium);
    try {
      await page.open(`http://127.0.0.1:${server.addr.port}/examples/web/?steps=${STEPS}`);
      let state: DemoState | null = null;
      const deadline = Date.now() + 180_000;
      while (Date.now() < deadline) {
        state = await page.evaluate<DemoState | null>("globalThis.halfstepDemo ?? null");
        if (state && ["done", "error", "no-webgpu"].includes(state.status)) break;
        await new Promise((r) => setTimeout(r, 250));
      }
      assert.ok(state, `the page never ran its script (bundle not loaded?): ${page.problems}`);
      assert.deepEqual(page.problems, [], "the page logged errors");
      assert.notEqual(state.status, "error", `the page failed: ${state.error}`);
      if (state.status === "no-webgpu") {
        console.log(
          "This Chromium has no WebGPU here; the page loaded the bundle without errors, " +
            "but no training step could run.",
        );
        return;
      }
      assert.equal(state.status, "done", `training did not finish in time: ${state.steps} steps`);
      assert.equal(state.steps, STEPS);
      const first = state.losses[0], last = state.losses.at(-1)!;
      assert.equal(first.step, 1);
      assert.equal(last.step, STEPS);
      assert.ok(Math.abs(first.loss - Math.log(2)) < 0.15, `starts near ln 2: ${first.loss}`);
      assert.ok(last.loss < 0.85 * first.loss, `the loss falls: ${first.loss} → ${last.loss}`);
      assert.ok(state.accuracy !== null && state.accuracy > 0.6, `accuracy ${state.accuracy}`);
      assert.equal(state.skippedSteps, 0);
      // Without shader-f16 the trainer runs f32 with loss scaling off (scale 1), as PyTorch does.
      const scale = state.f16 ? 65536 : 1;
      assert.equal(state.scale, scale, "loss scaling at its initial scale (or off), no overflow");
      console.log(
        `${state.adapter} (f16 ${state.f16}): loss ${first.loss.toFixed(3)} → ` +
          `${last.loss.toFixed(3)} in ${STEPS} steps, accuracy ${
            (100 * state.accuracy).toFixed(1)
          }%`,
      );
    } finally {
      await page.close();
      await server.shutdown();
    }
  },
});
