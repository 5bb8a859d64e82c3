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
import { GPU_TEST } from "../helpers/gpu.ts";
import type { Tensor } from "../../mod.ts";
import {
  disposeRun,
  lossBits,
  makeBatch,
  makeRun,
  type RunSetup,
  snapshot,
  train,
} from "../helpers/capture_runs.ts";

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

Deno.test({
  name: "a captured step takes its batch as host data (written into its own input buffers), " +
    "with the same results",
  ...GPU_TEST,
  async fn() {
    const setup: RunSetup = { model: "gpt", amp: "f16", dropout: true };
    const eager = makeRun(setup), captured = makeRun(setup);
    const step = captured.trainer.capture(captured.loss);
    const losses: [Tensor[], Tensor[]] = [[], []];
    for (let i = 0; i < 8; i++) {
      const [x, y] = makeBatch(setup, i);
      losses[0].push(eager.trainer.step(() => eager.loss(x, y)));
      const host = async (t: Tensor) => ({ data: await t.read(), shape: t.shape, dtype: t.dtype });
      losses[1].push(step.run(await host(x), await host(y)));
      x.dispose();
      y.dispose();
    }
    assert.equal(step.stats.replayed, 5);
    assert.deepEqual(await lossBits(losses[1]), await lossBits(losses[0]));
    assert.deepEqual(await snapshot(captured), await snapshot(eager));
    assert.throws(
      () => step.run({ data: [1, 2], shape: [3] }),
      /input 0 has 2 values for shape \[3\]/,
    );
    disposeRun(eager);
    disposeRun(captured);
  },
});
