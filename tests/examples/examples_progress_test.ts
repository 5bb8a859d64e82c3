/**
 * Every long phase of the examples draws a progress bar with the time left
 * on a terminal (issue 39): a short CNN run used to show nothing for 84 s of
 * training (fewer steps than the 50 between log lines), then 75 s of silent
 * evaluation, and tiny_gpt had no bar at all. The scripts run here under
 * `script`, which gives them a terminal, with log lines far apart, and the
 * bar must move step by step and batch by batch, with "ETA".
 */
import assert from "node:assert/strict";
import { Progress } from "../../examples/cli/progress.ts";
import { MNIST, TINY_GPT } from "../helpers/examples.ts";

/** What a bar writes after its text: erase to the end of the line. */
const CLEAR_LINE = "\x1b[K";

Deno.test("progress: a bar redraws at most every 100 ms (the last always), with the time left, and ends its line", async () => {
  let out = "";
  const progress = new Progress(true, { terminal: true, write: (t) => void (out += t) });
  for (let done = 1; done <= 5; done++) {
    progress.update(done, 5, "working");
    await new Promise((r) => setTimeout(r, done < 3 ? 120 : 0));
  }
  progress.finish();
  const frames = out.split("\r").filter(Boolean);
  assert.ok(frames.length >= 3 && frames.length <= 4, JSON.stringify(frames)); // 1, 2, 3, (4,) 5
  assert.equal(frames.at(-1), `${"█".repeat(24)} 5/5 working  ETA 0:00${CLEAR_LINE}\n`);
  assert.ok(frames.slice(1).every((f) => f.includes("ETA")), "the time left once there is a pace");
  let none = "";
  const piped = new Progress(true, { terminal: false, write: (t) => void (none += t) });
  piped.update(1, 2, "x");
  piped.finish();
  assert.equal(none, "", "no bar outside a terminal");
});

/** Runs `script` (a Deno example) with a terminal for stdout; the frames its bar drew. */
async function barFrames(path: string, args: string[]): Promise<string[]> {
  const command = [Deno.execPath(), "run", "--allow-read", "--allow-env", path, ...args]
    .map((w) => `'${w}'`).join(" ");
  const out = await new Deno.Command("script", {
    args: ["-qec", command, "/dev/null"],
    env: { DENO_WEBGPU_BACKEND: "vulkan,metal,dx12", NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  assert.equal(out.code, 0, text.slice(-2000));
  return text.split(/\r|\n/).map((f) => f.replaceAll(CLEAR_LINE, "")).filter((f) =>
    f.includes("░") || f.includes("█")
  );
}

/** The `done` of each frame matching `label`, in order. */
function counts(frames: string[], label: RegExp, total: number): number[] {
  return frames.filter((f) => label.test(f)).map((f) =>
    Number(f.match(new RegExp(`(\\d+)/${total} `))?.[1])
  );
}

Deno.test({
  name: "progress: mnist's bar moves every step between log lines, and evaluation draws its own",
  ignore: Deno.build.os === "windows",
  async fn() {
    const frames = await barFrames(MNIST, [
      "--limit",
      "1024",
      "--epochs",
      "1",
      "--log-every",
      "1000",
    ]);
    const training = counts(frames, /epoch 1/, 8);
    assert.ok(training.filter((d) => d < 8).length >= 2, `steps before the log: ${training}`);
    assert.ok(frames.some((f) => /epoch 1.*ETA \d+:\d\d$/.test(f)), "the time left while training");
    const evaluation = counts(frames, /evaluating epoch 1/, 10000);
    assert.ok(evaluation.length >= 2 && evaluation.at(-1) === 10000, `evaluation: ${evaluation}`);
    assert.ok(frames.some((f) => /evaluating.*ETA \d+:\d\d$/.test(f)), "the time left evaluating");
  },
});

Deno.test({
  name: "progress: tiny_gpt draws a bar with the time left while training",
  ignore: Deno.build.os === "windows",
  async fn() {
    const args = ["--steps", "12", "--log-every", "100", "--eval-windows", "64", "--samples", "1"];
    const frames = await barFrames(TINY_GPT, args);
    const training = counts(frames, /training|train loss/, 12);
    assert.ok(training.filter((d) => d < 12).length >= 2, `steps between logs: ${training}`);
    assert.ok(frames.some((f) => /\/12 .*ETA \d+:\d\d$/.test(f)), "the time left");
  },
});
