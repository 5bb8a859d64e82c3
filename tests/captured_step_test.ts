/**
 * A captured training step equals the uncaptured one bit for bit (issue
 * 45): the MLP and the tiny GPT, each in f32, f16 AMP with overflows forced
 * again and again (a loss scale of 2^24 that grows every 2 clean steps, an
 * Inf in a batch), bf16, accumulation over 4 micro-batches, checkpointing,
 * dropout and a warmup-cosine schedule, over at least 20 optimizer steps:
 * every loss, and at the end the weights, buffers, working copies,
 * optimizer state, learning rates, scaler and trainer state and random
 * generators. The step must have been replayed, not run eagerly.
 */
import assert from "node:assert/strict";
import { GPU_TEST } from "./_gpu.ts";
import { disposeRun, lossBits, makeRun, type RunSetup, snapshot, train } from "./_capture_runs.ts";

const STEPS = 20;

async function capturedEqualsEager(setup: RunSetup): Promise<void> {
  const micro = STEPS * (setup.accumulation ?? 1);
  const eager = makeRun(setup), captured = makeRun(setup);
  const step = captured.trainer.capture(captured.loss, {
    onRecapture: (why) => assert.fail(`recaptured: ${why}`),
  });
  const eagerLosses = train(eager, 0, micro, null);
  const capturedLosses = train(captured, 0, micro, step);
  const stats = step.stats;
  assert.equal(stats.captures, 1);
  assert.equal(stats.eager, 0);
  assert.ok(stats.recorded <= 3 * (setup.accumulation ?? 1), `recorded ${stats.recorded}`);
  assert.equal(stats.replayed, micro - stats.recorded);
  assert.ok(stats.replayed >= micro - 12, `only ${stats.replayed} of ${micro} replayed`);
  assert.deepEqual(await lossBits(capturedLosses), await lossBits(eagerLosses));
  const [a, b] = [await snapshot(captured), await snapshot(eager)];
  assert.equal(captured.trainer.steps, STEPS);
  if (setup.overflow) {
    const skipped = (a.trainer as { scaler: { skippedSteps: number } }).scaler.skippedSteps;
    assert.ok(skipped >= 3, `only ${skipped} steps overflowed`);
  }
  assert.deepEqual(a, b);
  disposeRun(eager);
  disposeRun(captured);
}

const SETUPS: [string, Omit<RunSetup, "model">][] = [
  ["f32", { amp: false }],
  ["f16 AMP with forced overflows and clipping", { amp: "f16", overflow: true, clip: 0.5 }],
  ["bf16", { amp: "bf16" }],
  ["f16 AMP, accumulation 4, warmup-cosine schedule", {
    amp: "f16",
    accumulation: 4,
    schedule: true,
  }],
  ["f16 AMP, checkpointing and dropout", { amp: "f16", checkpoint: true, dropout: true }],
  ["bf16, dropout, accumulation 4 and a schedule", {
    amp: "bf16",
    dropout: true,
    accumulation: 4,
    schedule: true,
  }],
  ["f32, checkpointing, dropout, schedule", {
    amp: false,
    checkpoint: true,
    dropout: true,
    schedule: true,
  }],
];

for (const model of ["mlp", "gpt"] as const) {
  for (const [name, setup] of SETUPS) {
    Deno.test({
      name: `captured = uncaptured bit for bit over ${STEPS} steps: ${model}, ${name}`,
      ...GPU_TEST,
      fn: () => capturedEqualsEager({ model, ...setup }),
    });
  }
}
