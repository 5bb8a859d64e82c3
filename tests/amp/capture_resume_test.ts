/**
 * A captured run saved and resumed continues exactly, `gpu.profile()` of a
 * replayed step shows the kernels of an uncaptured one, and the buffers a
 * capture keeps are the eager step's (issue 45).
 */
import assert from "node:assert/strict";
import { loadTrainingState, saveTrainingState } from "../../files.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import {
  disposeRun,
  lossBits,
  makeBatch,
  makeRun,
  type Run,
  type RunSetup,
  snapshot,
  train,
} from "../helpers/capture_runs.ts";
import type { CapturedStep } from "../../mod.ts";

const SETUP: RunSetup = {
  model: "mlp",
  amp: "f16",
  dropout: true,
  schedule: true,
  accumulation: 2,
  clip: 1,
};

/** The parts a training-state file holds. */
const parts = (run: Run) => ({
  model: run.model,
  optimizer: run.optimizer,
  trainer: run.trainer,
  scheduler: run.scheduler!,
});

async function resumeTest(savedAfter: number): Promise<void> {
  const dir = await Deno.makeTempDir(), path = `${dir}/run.safetensors`;
  const total = 40;
  const straight = makeRun(SETUP);
  const straightStep = straight.trainer.capture(straight.loss);
  const straightLosses = await lossBits(train(straight, 0, total, straightStep));

  const first = makeRun(SETUP);
  const firstStep = first.trainer.capture(first.loss);
  const losses = await lossBits(train(first, 0, savedAfter, firstStep));
  assert.ok(firstStep.stats.replayed > 0, "the saved run was replaying");
  await saveTrainingState(path, parts(first));
  disposeRun(first);

  const resumed = makeRun(SETUP, 7); // other weights and Dropout seed: everything comes from the file
  await loadTrainingState(path, parts(resumed));
  const step: CapturedStep = resumed.trainer.capture(resumed.loss);
  losses.push(...await lossBits(train(resumed, savedAfter, total, step)));
  assert.ok(step.stats.replayed > 0, "the resumed run replays");
  assert.deepEqual(losses, straightLosses);
  assert.deepEqual(await snapshot(resumed), await snapshot(straight));
  disposeRun(resumed);
  disposeRun(straight);
  await Deno.remove(dir, { recursive: true });
}

Deno.test({
  name: "a captured run saved at optimizer step 10 and resumed (captured) equals the " +
    "uninterrupted captured run bit for bit",
  ...GPU_TEST,
  fn: () => resumeTest(20),
});

Deno.test({
  name: "the same saved mid-accumulation: the replayed gradients so far are saved",
  ...GPU_TEST,
  fn: () => resumeTest(21),
});

Deno.test({
  name: "gpu.profile() of a replayed step shows the kernels of an uncaptured one",
  ...GPU_TEST,
  async fn() {
    const setup: RunSetup = { model: "gpt", amp: "f16", dropout: true };
    const eager = makeRun(setup), captured = makeRun(setup);
    const step = captured.trainer.capture(captured.loss);
    train(eager, 0, 4, null).forEach((l) => l.dispose());
    train(captured, 0, 4, step).forEach((l) => l.dispose());
    assert.ok(step.captured);
    const [x, y] = makeBatch(setup, 4);
    const kernels = async (fn: () => void) => {
      const report = await gpu.profile(fn, { print: false, timing: "wall" });
      return report.rows.map((r) => `${r.kernel} ${r.config} ×${r.calls}`).sort();
    };
    const replayed = await kernels(() => step.run(x, y).dispose());
    assert.equal(step.stats.replayed, 2);
    assert.deepEqual(
      replayed,
      await kernels(() => eager.trainer.step(() => eager.loss(x, y)).dispose()),
    );
    assert.ok(replayed.length > 10, replayed.join("\n"));
    assert.deepEqual(await snapshot(captured), await snapshot(eager));
    for (const t of [x, y]) t.dispose();
    disposeRun(eager);
    disposeRun(captured);
  },
});

Deno.test({
  name: "a capture keeps the buffers the eager step takes: the peak and the pool grow by " +
    "its input buffers and its loss only, and disposing it gives them back",
  ...GPU_TEST,
  async fn() {
    for (
      const setup of [{ model: "gpt", amp: "f16" }, { ...SETUP, accumulation: 1 }] as RunSetup[]
    ) {
      const figures = [];
      for (const captured of [false, true]) {
        await gpu.sync();
        gpu.pool.releaseCached();
        const run = makeRun(setup);
        const step = captured ? run.trainer.capture(run.loss) : null;
        const start = gpu.memoryStats();
        gpu.resetPeakMemory();
        let lossBytes = 0;
        for (let i = 0; i < 8; i++) {
          const [loss] = train(run, i, i + 1, step);
          lossBytes = loss.buffer.size;
          loss.dispose();
        }
        await gpu.sync();
        const end = gpu.memoryStats();
        const [x, y] = makeBatch(setup, 0);
        // The step's own input buffers, and the loss it hands out (eagerly, the step's own).
        const inputs = captured ? [x, y].reduce((n, t) => n + t.buffer.size, lossBytes) : 0;
        for (const t of [x, y]) t.dispose();
        figures.push({
          peak: end.peakBytes - start.allocatedBytes - inputs,
          reserved: end.reservedBytes - start.reservedBytes - inputs,
          captured: end.capturedBytes,
        });
        if (step) {
          assert.ok(step.stats.replayed >= 5);
          assert.ok(end.capturedBytes > 0, "the step's intermediates are held for it");
          step.dispose();
          assert.equal(gpu.memoryStats().capturedBytes, 0, "disposed: back to the pool");
        }
        disposeRun(run);
      }
      const [eager, replayed] = figures;
      assert.ok(replayed.peak <= eager.peak, JSON.stringify(figures));
      assert.equal(replayed.reserved, eager.reserved, JSON.stringify(figures));
    }
  },
});
