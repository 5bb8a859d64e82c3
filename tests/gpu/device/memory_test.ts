/**
 * Training loops leak no GPU memory: the bytes allocated between steps of a
 * real AMP loop stay flat, and the check itself catches a step that leaks.
 */
import assert, { AssertionError } from "node:assert/strict";
import {
  AdamW,
  addInPlace,
  AmpTrainer,
  cosineSchedule,
  crossEntropy,
  Linear,
  LrScheduler,
  noGrad,
  RandomGenerator,
  Sequential,
  Tensor,
} from "../../../mod.ts";
import { Gpt } from "../../../models/mod.ts";
import { assertFlatMemory } from "../../helpers/memory.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";

const FEATURES = 16, HIDDEN = 64, CLASSES = 4, BATCH = 32, ACCUMULATION = 2;

/** A 16-64-64-64-4 MLP (ReLU fused into the matmuls), checkpointed in two segments. */
function checkpointedMlp(seed: number): Sequential {
  const rng = new RandomGenerator(seed);
  const model = new Sequential(
    new Linear(FEATURES, HIDDEN, { seed: rng, activation: "relu" }),
    new Linear(HIDDEN, HIDDEN, { seed: rng, activation: "relu" }),
    new Linear(HIDDEN, HIDDEN, { seed: rng, activation: "relu" }),
    new Linear(HIDDEN, CLASSES, { seed: rng }),
  );
  model.checkpoint = 2;
  model.train();
  return model;
}

/** A synthetic batch: uniform features, the label is the argmax of four feature sums. */
function syntheticBatch(rng: RandomGenerator): { x: Float32Array; labels: Int32Array } {
  const x = rng.uniform(BATCH * FEATURES, -1, 1);
  const labels = Int32Array.from({ length: BATCH }, (_, r) => {
    const sums = [0, 1, 2, 3].map((c) =>
      x.subarray(r * FEATURES + 4 * c, r * FEATURES + 4 * c + 4).reduce((a, b) => a + b, 0)
    );
    return sums.indexOf(Math.max(...sums));
  });
  return { x, labels };
}

Deno.test({
  name: "memory: an AMP step (AdamW, accumulation, checkpointed Sequential) leaks no GPU memory",
  ...GPU_TEST,
  async fn() {
    const model = checkpointedMlp(1);
    const optimizer = new AdamW(model.parameters(), { lr: 1e-3, weightDecay: 0.01 });
    const trainer = new AmpTrainer(model, optimizer, {
      accumulationSteps: ACCUMULATION,
      maxGradNorm: 1,
    });
    assert.equal(trainer.masters !== null, gpu.f16, "AMP runs wherever the adapter has f16");
    const scheduler = new LrScheduler(optimizer, cosineSchedule({ totalSteps: 100 }));
    const rng = new RandomGenerator(2);
    // Like examples/mnist.ts: the losses are summed on the GPU, read only when logging.
    const lossSum = Tensor.zeros([]);
    // One optimizer step: its micro-batches, then the schedule.
    const step = () => {
      for (let m = 0; m < ACCUMULATION; m++) {
        const { x, labels } = syntheticBatch(rng);
        const loss = trainer.step(() =>
          crossEntropy(model.forward(Tensor.from(x, [BATCH, FEATURES])), labels)
        );
        noGrad(() => addInPlace(lossSum, loss));
        loss.dispose();
      }
      scheduler.step();
    };

    const bytes = await assertFlatMemory(step, { gpu, warmup: 2, repeats: 4, name: "AMP step" });
    assert.equal(bytes.length, 4);
    assert.equal(trainer.steps, 6, "every run is one optimizer step");
    assert.ok(model.lastCheckpointPlan !== null, "the forward passes were checkpointed");
    assert.equal(model.lastCheckpointPlan.segments.length, 2);
    assert.equal(await trainer.scaler.skippedSteps(), 0);
    const meanLoss = (await lossSum.item()) / (6 * ACCUMULATION);
    assert.ok(Number.isFinite(meanLoss) && meanLoss > 0, `mean loss ${meanLoss}`);
    lossSum.dispose();
    trainer.dispose();
    optimizer.dispose();
    model.dispose();
  },
});

Deno.test({
  name: "memory: a tiny GPT step under AMP with checkpointed blocks leaks no GPU memory",
  ...GPU_TEST,
  async fn() {
    const config = { vocab: 11, context: 16, layers: 2, dim: 32, heads: 4, seed: 5 };
    const model = new Gpt(config);
    model.blocks.checkpoint = config.layers;
    const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
    const trainer = new AmpTrainer(model, optimizer, { maxGradNorm: 1 });
    const rng = new RandomGenerator(6);
    const n = 4 * config.context;
    const step = () => {
      const ids = Array.from(rng.uniform(2 * n), (u) => Math.floor(u * config.vocab));
      const x = Tensor.from(ids.slice(0, n), [4, config.context], { dtype: "i32" });
      trainer.step(() => crossEntropy(model.forward(x), ids.slice(n))).dispose();
      x.dispose();
    };
    await assertFlatMemory(step, { gpu, name: "tiny GPT step" });
    assert.equal(await trainer.scaler.skippedSteps(), 0);
    trainer.dispose();
    optimizer.dispose();
    model.dispose();
  },
});

Deno.test({
  name: "memory: assertFlatMemory fails, naming the bytes, on a step that leaks",
  ...GPU_TEST,
  async fn() {
    // A step that creates a 1 KiB tensor and never disposes it.
    const leaked: Tensor[] = [];
    const before = gpu.memoryStats().allocatedBytes;
    const after = (runs: number) => before + runs * 1024;
    await assert.rejects(
      assertFlatMemory(() => void leaked.push(Tensor.zeros([256])), { gpu, name: "leaky step" }),
      (e: unknown) => {
        assert.ok(e instanceof AssertionError);
        assert.match(
          e.message,
          new RegExp(`^leaky step: .* changed: ${after(3)}, ${after(4)}, ${after(5)} bytes `),
        );
        assert.match(e.message, /\(after 2 warm-up runs; \+2048 bytes over 2 runs\)/);
        return true;
      },
    );
    assert.equal(leaked.length, 5, "2 warm-up runs and 3 measured ones");

    // The classic training-loop leak: the loss that trainer.step returns is never disposed.
    const model = checkpointedMlp(3);
    const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
    const trainer = new AmpTrainer(model, optimizer);
    const rng = new RandomGenerator(4);
    await assert.rejects(
      assertFlatMemory(() => {
        const { x, labels } = syntheticBatch(rng);
        leaked.push(
          trainer.step(() =>
            crossEntropy(model.forward(Tensor.from(x, [BATCH, FEATURES])), labels)
          ),
        );
      }, { gpu, name: "undisposed loss" }),
      AssertionError,
    );
    for (const t of leaked) t.dispose();
    trainer.dispose();
    optimizer.dispose();
    model.dispose();
    assert.equal(gpu.memoryStats().allocatedBytes, before, "everything freed");
  },
});

Deno.test({
  name: "memory: warm-up runs absorb what a step allocates once; bad counts are a RangeError",
  ...GPU_TEST,
  async fn() {
    // Allocates on its second run only, then keeps it: like optimizer state, made at the
    // first optimizer step (the second run with two accumulated micro-batches).
    let runs = 0, state: Tensor | null = null;
    const step = () => {
      if (++runs === 2) state = Tensor.zeros([1024]);
    };
    const before = gpu.memoryStats().allocatedBytes;
    await assert.rejects(assertFlatMemory(step, { gpu, warmup: 0 }), AssertionError);
    state!.dispose();
    runs = 0;
    const bytes = await assertFlatMemory(step, { gpu }); // two warm-up runs by default
    assert.deepEqual(bytes, [before + 4096, before + 4096, before + 4096]);
    state!.dispose();
    await assert.rejects(assertFlatMemory(step, { gpu, repeats: 1 }), RangeError);
    await assert.rejects(assertFlatMemory(step, { gpu, warmup: -1 }), RangeError);
  },
});
