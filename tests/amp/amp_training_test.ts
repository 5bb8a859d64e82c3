/**
 * AMP behaviour end to end: skipped steps leave everything bit-identical,
 * accumulation equals a big batch, a resumed run continues exactly, and AMP
 * trains as well as f32.
 */
import assert from "node:assert/strict";
import {
  AdamW,
  AmpTrainer,
  type AmpTrainerOptions,
  crossEntropy,
  initGpu,
  Linear,
  RandomGenerator,
  ReLU,
  Sequential,
  SGD,
  Tensor,
} from "../../mod.ts";
import { loadTrainingState, saveTrainingState } from "../../files.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { capturedWarnings } from "../helpers/warnings.ts";
import { batch, CLASSES, FEATURES } from "../helpers/training_state.ts";

/** The trainer's f16 working copies, master by master. */
function workingCopies(trainer: AmpTrainer): Tensor[] {
  const masters = trainer.masters!;
  return masters.masters.map((m) => masters.copyOf(m)!);
}

function mlp(seed: number): Sequential {
  const rng = new RandomGenerator(seed);
  return new Sequential(
    new Linear(FEATURES, 16, { seed: rng }),
    new ReLU(),
    new Linear(16, CLASSES, { seed: rng }),
  );
}

function trainStep(
  trainer: AmpTrainer,
  model: Sequential,
  b: { x: Float32Array; labels: number[] },
) {
  const loss = trainer.step(() =>
    crossEntropy(model.forward(Tensor.from(b.x, [b.labels.length, FEATURES])), b.labels)
  );
  return loss;
}

async function raw(tensors: Iterable<Tensor>): Promise<(Float32Array | Int32Array)[]> {
  const out: (Float32Array | Int32Array)[] = [];
  for (const t of tensors) out.push(await t.read());
  return out;
}

Deno.test({
  name: "AMP: an overflow skips the step; masters, f16 copies and Adam moments stay bit-identical",
  ...GPU_TEST,
  async fn() {
    const model = mlp(1);
    const optimizer = new AdamW(model.parameters(), { lr: 1e-2 });
    const trainer = new AmpTrainer(model, optimizer, { scaler: { growthInterval: 1000 } });
    for (let i = 0; i < 2; i++) (trainStep(trainer, model, batch(i, 16))).dispose();
    assert.equal(await trainer.scaler.getScale(), 2 ** 16);
    const masters = await raw(model.parameters());
    const copies = await raw(workingCopies(trainer));
    const moments = await optimizer.stateDict();
    const poisoned = batch(2, 16);
    poisoned.x[5] = Infinity; // an Inf in the batch
    trainStep(trainer, model, poisoned).dispose();
    assert.equal(await trainer.scaler.lastStepSkipped(), true);
    assert.equal(await trainer.scaler.skippedSteps(), 1);
    assert.equal(await trainer.scaler.getScale(), 2 ** 15, "the scale backs off");
    assert.deepEqual(await raw(model.parameters()), masters);
    assert.deepEqual(await raw(workingCopies(trainer)), copies);
    assert.deepEqual(await optimizer.stateDict(), moments);
    // The next clean step applies normally.
    trainStep(trainer, model, batch(3, 16)).dispose();
    assert.equal(await trainer.scaler.lastStepSkipped(), false);
    assert.notDeepEqual(await raw(model.parameters()), masters);
    trainer.dispose();
    optimizer.dispose();
  },
});

Deno.test({
  name: "AMP: a static huge loss scale overflows in f16 and is skipped without changing the scale",
  ...GPU_TEST,
  async fn() {
    const model = mlp(2);
    const optimizer = new SGD(model.parameters(), { lr: 0.1 });
    const trainer = new AmpTrainer(model, optimizer, { lossScale: 2 ** 120 });
    const before = await raw(model.parameters());
    trainStep(trainer, model, batch(0, 16)).dispose();
    assert.equal(await trainer.scaler.lastStepSkipped(), true);
    assert.equal(await trainer.scaler.getScale(), 2 ** 120, "static mode never changes");
    assert.deepEqual(await raw(model.parameters()), before);
    trainer.dispose();
    optimizer.dispose();
  },
});

Deno.test({
  name:
    "AMP without shader-f16: f32 training with loss scaling off, said once; scaler.enabled opts in",
  ...GPU_TEST,
  async fn() {
    const plain = await initGpu({ f16: "off", matmulTiling: "default", setDefault: false });
    const warnings = await capturedWarnings(async () => {
      const run = async (options: AmpTrainerOptions) => {
        const rng = new RandomGenerator(4);
        const model = new Sequential(
          new Linear(FEATURES, 16, { seed: rng, gpu: plain }),
          new ReLU(),
          new Linear(16, CLASSES, { seed: rng, gpu: plain }),
        );
        const optimizer = new SGD(model.parameters(), { lr: 0.1 });
        const trainer = new AmpTrainer(model, optimizer, options);
        for (let i = 0; i < 3; i++) {
          const b = batch(i, 16);
          const x = Tensor.from(b.x, [16, FEATURES], { gpu: plain });
          trainer.step(() => crossEntropy(model.forward(x), b.labels)).dispose();
          x.dispose();
        }
        const state = { scaler: trainer.scaler, params: await raw(model.parameters()) };
        const scale = await trainer.scaler.getScale();
        trainer.dispose();
        optimizer.dispose();
        return { ...state, scale };
      };
      const amp = await run({});
      assert.equal(amp.scaler.enabled, false);
      assert.equal(amp.scale, 1);
      await run({}); // a second trainer does not repeat the warning
      const f32 = await run({ enabled: false });
      assert.deepEqual(amp.params, f32.params, "AMP without f16 is exactly f32 training");
      const forced = await run({ scaler: { enabled: true } });
      assert.equal(forced.scaler.enabled, true);
      assert.equal(forced.scale, 2 ** 16);
    });
    plain.destroy();
    assert.equal(warnings.filter((w) => w.includes("loss scaling off")).length, 1, warnings.join());
  },
});

Deno.test({
  name: "AMP: 4 accumulated micro-batches of 8 update like one batch of 32",
  ...GPU_TEST,
  async fn() {
    const results: (Float32Array | Int32Array)[][] = [];
    for (const accumulation of [4, 1]) {
      const model = mlp(3);
      const optimizer = new SGD(model.parameters(), { lr: 0.5 });
      const trainer = new AmpTrainer(model, optimizer, {
        accumulationSteps: accumulation,
        lossScale: 2 ** 10,
      });
      const big = batch(7, 32);
      const size = 32 / accumulation;
      for (let m = 0; m < accumulation; m++) {
        const part = {
          x: big.x.slice(m * size * FEATURES, (m + 1) * size * FEATURES),
          labels: big.labels.slice(m * size, (m + 1) * size),
        };
        trainStep(trainer, model, part).dispose();
      }
      assert.equal(trainer.steps, 1);
      results.push(await raw(model.parameters()));
      trainer.dispose();
      optimizer.dispose();
    }
    // Forward products are the same per row. But each micro-batch's weight
    // gradient is an f16 matmul output (as under torch.autocast) before it is
    // cast up and summed into the fp32 master gradient: four f16 roundings
    // (half-ulp 2^-11 ≈ 4.9e-4 relative) against one. So the updates agree to
    // about 2e-3 of their size.
    const initial = await raw(mlp(3).parameters());
    for (const [i, accumulated] of results[0].entries()) {
      const single = results[1][i];
      accumulated.forEach((v, j) => {
        const da = v - initial[i][j], db = single[j] - initial[i][j];
        assert.ok(
          Math.abs(da - db) <= 1e-6 + 2e-3 * Math.abs(db),
          `param ${i}[${j}]: update ${da} vs ${db}`,
        );
      });
    }
  },
});

Deno.test({
  name:
    "AMP: saving model + optimizer + scaler mid-run and resuming gives exactly the uninterrupted run",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const setup = (seed: number) => {
      const model = mlp(seed);
      const optimizer = new AdamW(model.parameters(), { lr: 5e-3 });
      const trainer = new AmpTrainer(model, optimizer, {
        scaler: { growthInterval: 2 },
        accumulationSteps: 2,
      });
      return { model, optimizer, trainer };
    };
    const straight = setup(4);
    for (let i = 0; i < 12; i++) trainStep(straight.trainer, straight.model, batch(i, 8)).dispose();

    const first = setup(4);
    for (let i = 0; i < 7; i++) trainStep(first.trainer, first.model, batch(i, 8)).dispose();
    await saveTrainingState(`${dir}/run.safetensors`, first, { extra: { nextBatch: 7 } });
    const resumed = setup(99); // different initial weights: everything must come from the file
    const extra = await loadTrainingState(`${dir}/run.safetensors`, resumed) as {
      nextBatch: number;
    };
    for (let i = extra.nextBatch; i < 12; i++) {
      trainStep(resumed.trainer, resumed.model, batch(i, 8)).dispose();
    }

    assert.deepEqual(await raw(resumed.model.parameters()), await raw(straight.model.parameters()));
    assert.deepEqual(await resumed.optimizer.stateDict(), await straight.optimizer.stateDict());
    assert.deepEqual(await resumed.trainer.stateDict(), await straight.trainer.stateDict());
    await Deno.remove(dir, { recursive: true });
  },
});

Deno.test({
  name: "AMP trains an MLP to the same loss as f32 (within 0.05 nats)",
  ...GPU_TEST,
  async fn() {
    const finals: number[] = [];
    for (const enabled of [false, true]) {
      const model = mlp(5);
      const optimizer = new AdamW(model.parameters(), { lr: 1e-2 });
      const trainer = new AmpTrainer(model, optimizer, { enabled });
      let last = 0;
      for (let i = 0; i < 150; i++) {
        const loss = trainStep(trainer, model, batch(i % 20, 32));
        if (i >= 140) last += (await loss.item()) / 10;
        loss.dispose();
      }
      assert.equal(await trainer.scaler.skippedSteps(), 0);
      finals.push(last);
      trainer.dispose();
      optimizer.dispose();
    }
    const [f32, amp] = finals;
    assert.ok(f32 < 0.35, `f32 trains (${f32})`);
    assert.ok(Math.abs(amp - f32) < 0.05, `AMP ${amp} vs f32 ${f32}`);
  },
});
