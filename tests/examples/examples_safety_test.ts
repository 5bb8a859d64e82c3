/**
 * The examples protect the user's work, run as a user runs them: a diverged
 * run stops with one line and a non-zero status and leaves the last good file
 * byte for byte; a run that cannot fit the adapter stops before the first
 * step, naming the flag to lower; a resume that would change --lr or
 * --loss-scale is refused unless --override, which then takes effect; a
 * second run writing the same --save is refused; a path that cannot be
 * checked says why.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "../helpers/bundle.ts";
import {
  assertRefused,
  errorLines,
  events,
  MNIST,
  mnistRunArgs,
  QUICK,
  type Run,
  run,
  TINY_GPT,
  withTempDir,
} from "../helpers/examples.ts";

/** A small, quick tiny GPT run. */
const GPT_QUICK = ["--steps", "12", "--log-every", "4", "--eval-windows", "8", "--samples", "1"];

async function bytesOf(path: string): Promise<Uint8Array> {
  return await Deno.readFile(path);
}

async function exists(path: string): Promise<boolean> {
  return await Deno.stat(path).then(() => true, () => false);
}

Deno.test("examples: a diverged run exits non-zero and leaves the last good file byte for byte", async () => {
  await withTempDir(async (dir) => {
    const good = join(dir, "good.safetensors");
    const first = await run(MNIST, [...QUICK, "--save", good, "--json"]);
    assert.equal(first.code, 0, first.stderr);
    const before = await bytesOf(good);
    // f32: the loss goes to NaN in epoch 1; the save after it must not happen.
    const nan = await run(MNIST, [
      ...QUICK,
      "--lr",
      "1e30",
      "--save",
      good,
      "--overwrite",
      "--json",
    ]);
    assert.equal(nan.code, 3, nan.stderr);
    const lines = errorLines(nan);
    assert.equal(lines.length, 1, JSON.stringify(lines));
    assert.match(lines[0], /^mnist: training diverged in epoch 1 .*lower --lr; nothing was saved/);
    assert.ok(!events(nan.stdout).some((e) => e.event === "save"), "no save after divergence");
    assert.deepEqual(await bytesOf(good), before, "the good file is unchanged");
    assert.ok(!(await exists(`${good}.lock`)), "the lock is released on exit 3");
    // AMP with a static scale every step overflows at: all steps skipped is divergence too.
    const amp = ["--amp", "--loss-scale", "16777216"];
    const skipped = await run(MNIST, [...QUICK, ...amp, "--save", good, "--overwrite", "--json"]);
    assert.equal(skipped.code, 3, skipped.stderr);
    assert.match(skipped.stderr, /8 of 8 optimizer steps skipped .*lower --loss-scale 16777216/);
    assert.deepEqual(await bytesOf(good), before, "the good file is unchanged");
  });
});

Deno.test("examples: a diverged tiny GPT stops at the first logged non-finite loss", async () => {
  const gpt = await run(TINY_GPT, [...GPT_QUICK, "--lr", "1e30", "--json"]);
  assert.equal(gpt.code, 3, gpt.stderr);
  assert.match(gpt.stderr, /^tiny_gpt: training diverged at step 4: .*lower --lr\.$/m);
  assert.ok(!events(gpt.stdout).some((e) => e.event === "final"), "no report of a NaN model");
});

/** Asserts exit status 2 with one line of stderr matching `message` (after the start report). */
function assertResumeRefused(r: Run, message: RegExp, what: string): void {
  assert.equal(r.code, 2, `${what}: exit status (stderr: ${r.stderr})`);
  const lines = errorLines(r);
  assert.equal(lines.length, 1, `${what}: one line, got ${JSON.stringify(lines)}`);
  assert.match(lines[0], message, what);
  assert.ok(!events(r.stdout).some((e) => e.event === "step"), `${what}: nothing trained`);
}

Deno.test("examples: a run too large for the adapter stops before the first step, naming the flag", async () => {
  await withTempDir(async (dir) => {
    const out = join(dir, "x.safetensors");
    const cases: [string, string[], RegExp][] = [
      [
        MNIST,
        ["--model", "cnn", "--limit", "256", "--eval-batch", "10000", "--save", out],
        /^mnist: --eval-batch 10000: the first convolution's output f32 \[10000, 32, 26, 26\] needs 865\.3 MB, over this adapter's \w+ of [\d.]+ MB: lower --eval-batch to about \d+\.$/,
      ],
      [
        MNIST,
        ["--batch", "60000"],
        /^mnist: --batch 60000: the input .* lower --batch to about \d+\.$/,
      ],
      [TINY_GPT, ["--context", "100000"], /^tiny_gpt: .* lower --context to about \d+\.$/],
      [
        TINY_GPT,
        ["--dim", "100000"],
        /^tiny_gpt: fc1's weight f32 \[100000, 400000\] .* lower --dim to about \d+\.$/,
      ],
    ];
    for (const [script, args, message] of cases) {
      assertRefused(await run(script, [...args, "--json"]), message, args.join(" "));
    }
    assert.ok(!(await exists(out)), "nothing written");
    assert.ok(!(await exists(`${out}.lock`)), "the lock is released on exit 2");
  });
});

Deno.test("examples: resuming with another --lr or --loss-scale is refused unless --override, which takes effect", async () => {
  await withTempDir(async (dir) => {
    const state = join(dir, "run.safetensors");
    const flags = [...QUICK, "--amp", "--save", state, "--json"];
    const first = await run(MNIST, flags);
    assert.equal(first.code, 0, first.stderr);
    const resume = [...flags, "--resume", state];
    const lr = await run(MNIST, [...resume, "--lr", "0.01"]);
    assertResumeRefused(
      lr,
      /would change --lr 0\.01 \(saved: 0\.002\); .*--override/,
      "--lr",
    );
    const scale = await run(MNIST, [...resume, "--loss-scale", "1024"]);
    assertResumeRefused(
      scale,
      /would change --loss-scale 1024 \(saved: 0\); .*--override/,
      "--loss-scale",
    );
    const seed = await run(MNIST, [...resume, "--seed", "1", "--override"]);
    assertResumeRefused(
      seed,
      /saved by a run with other flags: --seed 1 \(saved: 0\)\. Resume with the saved flags/,
      "--seed",
    );
    const over = await run(MNIST, [
      ...resume,
      "--lr",
      "0.01",
      "--loss-scale",
      "1024",
      "--override",
    ]);
    assert.equal(over.code, 0, over.stderr);
    const all = events(over.stdout);
    const changes = all.find((e) => e.event === "override")?.changes;
    assert.deepEqual(changes, [
      { flag: "lr", saved: 0.002, given: 0.01 },
      { flag: "loss-scale", saved: 0, given: 1024 },
    ]);
    assert.equal(all.at(-1)!.lossScale, 1024, "the given static scale took effect");
  });
});

Deno.test("examples: a second run writing the same --save is refused, naming the first one's pid", async () => {
  await withTempDir(async (dir) => {
    const state = join(dir, "run.safetensors");
    const args = ["--limit", "1024", "--epochs", "50", "--save", state, "--json"];
    const first = new Deno.Command(Deno.execPath(), {
      args: mnistRunArgs(args),
      env: { DENO_WEBGPU_BACKEND: "vulkan,metal,dx12", NO_COLOR: "1" },
      stdout: "piped",
      stderr: "null",
    }).spawn();
    const reader = first.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let code;
    try {
      let seen = "";
      while (!seen.includes('"event":"start"')) {
        const { value, done } = await reader.read();
        assert.ok(!done, "the first run ended before it started training");
        seen += value;
      }
      // One epoch: where the lock is missing, this run ends on its own.
      const second = await run(MNIST, [...args, "--epochs", "1"]);
      assertRefused(
        second,
        new RegExp(`--save .*run\\.safetensors is in use by another run \\(pid ${first.pid}[ )]`),
        "second writer",
      );
    } finally {
      first.kill("SIGTERM");
      await reader.cancel();
      code = (await first.status).code;
    }
    assert.equal(code, 143, "SIGTERM ends the run");
    assert.ok(!(await exists(`${state}.lock`)), "the lock is released on SIGTERM");
  });
});

Deno.test("examples: --save where the folder cannot be checked says why, not that it is missing", async () => {
  await withTempDir(async (dir) => {
    // Read access to the project only: checking /sys fails with a permission error.
    const permissions = [`--allow-read=${ROOT},${dir}`, "--allow-env", "--allow-write"];
    const r = await run(MNIST, ["--save", "/sys/x", "--json"], true, permissions);
    assertRefused(
      r,
      /--save \/sys\/x.* cannot be checked \(Requires read access/,
      "/sys",
    );
  });
});
