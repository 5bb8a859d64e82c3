/**
 * The browser demo, end to end: `deno task bundle`, the repository served on
 * 127.0.0.1, and `examples/web` opened in headless Chromium. Chromium brings
 * its own software WebGPU adapter (SwiftShader) on a machine without a GPU, so
 * the page must train here: the loss falls and the accuracy rises. A page that
 * found no WebGPU fails the test (it would otherwise pass without training).
 * The other tests take WebGPU away, or make the library throw, and check what
 * the page tells its user then.
 */
import assert from "node:assert/strict";
import { serveDirectory } from "../../examples/web/serve.ts";
import { findChromium, launchChromium } from "../helpers/browser.ts";
import { buildBundle, ROOT } from "../helpers/bundle.ts";

const STEPS = 60;

interface DemoState {
  status: "loading" | "starting" | "training" | "done" | "error" | "no-webgpu";
  message: string;
  adapter: string;
  software: boolean;
  heading: string;
  f16: boolean;
  steps: number;
  losses: { step: number; loss: number }[];
  accuracy: number | null;
  scale: number | null;
  skippedSteps: number | null;
  captured: boolean;
  replayedSteps: number;
  error: string | null;
}

const BROWSER_TEST = { sanitizeResources: false, sanitizeOps: false }; // closed in finally

let bundle: Promise<string> | null = null;

/**
 * Opens `path?query` of the served repository in headless Chromium and waits
 * until the page has finished (trained, failed, or found no WebGPU).
 */
async function runPage(
  path: string,
  options: { webgpu: boolean },
): Promise<{ state: DemoState; problems: string[]; screenshot: Uint8Array }> {
  const chromium = findChromium();
  assert.ok(
    chromium,
    "No Chromium found for the browser test: install Debian's `chromium` " +
      "(apt-get install chromium) or set HALFSTEP_CHROMIUM to a Chrome/Chromium binary.",
  );
  await (bundle ??= buildBundle());
  const server = serveDirectory(ROOT);
  const page = await launchChromium(chromium, options);
  try {
    await page.open(`http://127.0.0.1:${server.addr.port}${path}`);
    let state: DemoState | null = null;
    const started = Date.now();
    while (Date.now() < started + 180_000) {
      state = await page.evaluate<DemoState | null>("globalThis.halfstepDemo ?? null");
      if (state && ["done", "error", "no-webgpu"].includes(state.status)) break;
      if (!state && Date.now() > started + 10_000) break; // its module never ran
      await new Promise((r) => setTimeout(r, 250));
    }
    assert.ok(state, `the page never ran its script (bundle not loaded?): ${page.problems}`);
    return { state, problems: [...page.problems], screenshot: await page.screenshot() };
  } finally {
    await page.close();
    await server.shutdown();
  }
}

/** Throws unless the page trained all its steps: "no WebGPU" is a failure, not a pass. */
function assertTrained(state: DemoState): void {
  assert.notEqual(
    state.status,
    "no-webgpu",
    `Chromium had no WebGPU, so nothing trained: ${state.message} (headless Chromium ` +
      "needs --enable-unsafe-webgpu and brings SwiftShader when there is no GPU)",
  );
  assert.notEqual(state.status, "error", `the page failed: ${state.error}`);
  assert.equal(state.status, "done", `training did not finish in time: ${state.steps} steps`);
  assert.equal(state.steps, STEPS);
}

Deno.test({
  name: "web demo: headless Chromium loads the bundle and trains with live loss",
  ...BROWSER_TEST,
  async fn() {
    // Without the trailing slash, as people type it: the server redirects.
    const { state, problems } = await runPage(`/examples/web?steps=${STEPS}`, { webgpu: true });
    assert.deepEqual(problems, [], "the page logged errors");
    assertTrained(state);
    const first = state.losses[0], last = state.losses.at(-1)!;
    assert.equal(first.step, 1);
    assert.equal(last.step, STEPS);
    assert.ok(Math.abs(first.loss - Math.log(2)) < 0.15, `starts near ln 2: ${first.loss}`);
    assert.ok(last.loss < 0.85 * first.loss, `the loss falls: ${first.loss} → ${last.loss}`);
    assert.ok(state.accuracy !== null && state.accuracy > 0.6, `accuracy ${state.accuracy}`);
    assert.equal(state.skippedSteps, 0);
    // The page captures its step: recorded in its first steps, then replayed.
    assert.ok(state.captured, "captured");
    assert.ok(state.replayedSteps >= STEPS - 3, `replayed ${state.replayedSteps} of ${STEPS}`);
    // The heading names the adapter it ran on; on a software one it never says "your GPU".
    assert.ok(state.heading.includes(state.adapter), state.heading);
    assert.doesNotMatch(state.heading, /your GPU/);
    if (/swiftshader/i.test(state.adapter)) {
      assert.ok(state.software, `${state.adapter} is a software adapter`);
      assert.match(state.heading, /a software adapter \(the CPU/);
    }
    // Without shader-f16 the trainer runs f32 with loss scaling off (scale 1), as PyTorch does.
    const scale = state.f16 ? 65536 : 1;
    assert.equal(state.scale, scale, "loss scaling at its initial scale (or off), no overflow");
    console.log(
      `${state.adapter} (f16 ${state.f16}): loss ${first.loss.toFixed(3)} → ` +
        `${last.loss.toFixed(3)} in ${STEPS} steps, accuracy ${(100 * state.accuracy).toFixed(1)}%`,
    );
  },
});

Deno.test({
  name: "web demo: without WebGPU the page tells a browser user how to enable it, and fails",
  ...BROWSER_TEST,
  async fn() {
    const { state, problems } = await runPage(`/examples/web/?steps=${STEPS}`, { webgpu: false });
    assert.deepEqual(problems, [], "the page logged errors");
    assert.equal(state.status, "no-webgpu", state.message);
    // Chromium 156 keeps navigator.gpu and gives no adapter; others may drop navigator.gpu.
    assert.match(state.message, /no adapter|navigator\.gpu is missing/);
    assert.match(state.message, /chrome:\/\/flags\/#enable-unsafe-webgpu/);
    // Deno's advice (a Vulkan driver from apt) means nothing to a browser user.
    assert.doesNotMatch(state.message, /apt-get|mesa|driver/i);
    assert.throws(() => assertTrained(state), /Chromium had no WebGPU, so nothing trained/);
  },
});

Deno.test({
  name: "web demo: an error from the library is shown as an error with its message",
  ...BROWSER_TEST,
  async fn() {
    // An invalid f16 mode makes initGpu throw once an adapter is found.
    const { state, problems } = await runPage(`/examples/web/?f16=sometimes`, { webgpu: true });
    assert.equal(state.status, "error", `${state.status}: ${state.message}`);
    assert.match(state.message, /^error: ValueError: .*initGpu.*f16.*sometimes/);
    assert.match(state.error ?? "", /initGpu/);
    assert.equal(problems.length, 1, `the page reports it once: ${problems}`);
    assert.throws(() => assertTrained(state), /the page failed/);
  },
});

Deno.test({
  name: "web server: a folder without its trailing slash redirects to it, query kept",
  ...BROWSER_TEST,
  async fn() {
    const server = serveDirectory(ROOT);
    try {
      const base = `http://127.0.0.1:${server.addr.port}`;
      const bare = await fetch(`${base}/examples/web?steps=5`, { redirect: "manual" });
      await bare.body?.cancel();
      assert.equal(bare.status, 301);
      assert.equal(bare.headers.get("location"), `${base}/examples/web/?steps=5`);
      const page = await fetch(`${base}/examples/web`);
      assert.equal(page.url, `${base}/examples/web/`);
      assert.match(await page.text(), /<script type="module" src="\.\/spirals\.js">/);
      const script = await fetch(new URL("./spirals.js", page.url));
      await script.body?.cancel();
      assert.equal(script.status, 200, "the page's relative import resolves");
      const ts = await fetch(`${base}/mod.ts`);
      await ts.body?.cancel();
      assert.equal(ts.headers.get("content-type"), "application/typescript; charset=utf-8");
    } finally {
      await server.shutdown();
    }
  },
});
