/**
 * What would make a replayed step differ from an eager one is caught before
 * it runs (issue 45): each change either captures the step again, told in
 * one line, and the run goes on equal bit for bit to an eager run that saw
 * the same change, or is refused in one line. Changes: another input shape,
 * a module's setting (eval mode, checkpointing), a parameter frozen or
 * registered, the tuner picking another kernel (lazily, at a wait), a
 * tensor the step uses freed, the targets starting to hold the ignore index,
 * an eager step inside an accumulation cycle. Refused: a read inside the
 * step, a host branch, data uploaded from JavaScript, an id out of range (as
 * eagerly), a numerics inspector, an async step, a lost device. A pool reset
 * between replays changes nothing.
 */
import assert from "node:assert/strict";
import {
  AdamW,
  AmpTrainer,
  crossEntropy,
  GpuError,
  initGpu,
  Linear,
  Module,
  NumericsInspector,
  RandomGenerator,
  scale,
  StateError,
  Tensor,
  ValueError,
} from "../../mod.ts";
import { matmulCandidates, matmulSettings } from "../../gpu/mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { withLazyTuning } from "../helpers/lazy_tuning.ts";
import {
  disposeRun,
  lossBits,
  makeBatch,
  makeRun,
  type Run,
  type RunSetup,
  snapshot,
} from "../helpers/capture_runs.ts";

const AMP: RunSetup = { model: "mlp", amp: "f16", dropout: true };

/**
 * Steps an eager and a captured run of `setup` side by side over `batches`,
 * `change(run, i)` applied to both before micro-batch i; returns the reasons
 * the captured step gave for capturing again, after checking every loss and
 * the final state equal bit for bit.
 */
async function sideBySide(
  setup: RunSetup,
  batches: number,
  change: (run: Run, i: number) => void,
  batch: (i: number) => [Tensor, Tensor] = (i) => makeBatch(setup, i),
): Promise<string[]> {
  const reasons: string[] = [];
  const eager = makeRun(setup), captured = makeRun(setup);
  const step = captured.trainer.capture(captured.loss, { onRecapture: (r) => reasons.push(r) });
  const losses: [Tensor[], Tensor[]] = [[], []];
  for (let i = 0; i < batches; i++) {
    change(eager, i);
    change(captured, i);
    const [x, y] = batch(i);
    losses[0].push(eager.trainer.step(() => eager.loss(x, y)));
    losses[1].push(step.run(x, y));
    x.dispose();
    y.dispose();
  }
  assert.ok(step.stats.replayed > 0, "it replayed");
  assert.deepEqual(await lossBits(losses[1]), await lossBits(losses[0]));
  assert.deepEqual(await snapshot(captured), await snapshot(eager));
  disposeRun(eager);
  disposeRun(captured);
  return reasons;
}

Deno.test({
  name: "capture guards: another input shape captures again (one line), and back",
  ...GPU_TEST,
  async fn() {
    const rows = (i: number) => (i >= 6 && i < 12 ? 4 : 6);
    const reasons = await sideBySide(AMP, 18, () => {}, (i) => {
      const n = rows(i);
      const x = new RandomGenerator(300 + i).uniform(n * 12, -1, 1);
      const labels = Array.from({ length: n }, (_, r) => (r + i) % 5);
      return [Tensor.from(x, [n, 12]), Tensor.from(labels, [n], { dtype: "i32" })];
    });
    assert.deepEqual(reasons, [
      "input 0 is f32 [4, 12], the step was captured with f32 [6, 12]",
      "input 0 is f32 [6, 12], the step was captured with f32 [4, 12]",
    ]);
  },
});

Deno.test({
  name: "capture guards: eval mode, a checkpointing setting and a frozen parameter each " +
    "capture again, and the run equals the eager one",
  ...GPU_TEST,
  async fn() {
    const setup: RunSetup = { ...AMP, checkpoint: true };
    const reasons = await sideBySide(setup, 24, (run, i) => {
      if (i === 6) run.model.eval();
      if (i === 10) run.model.train();
      if (i === 14) (run.model as unknown as { checkpoint: number | null }).checkpoint = null;
      if (i === 18) run.model.parameters()[0].requiresGrad = false;
    });
    assert.equal(reasons.length, 4, reasons.join("; "));
    assert.match(reasons[0], /^the model's training is false, the step was captured with true$/);
    assert.match(reasons[1], /training is true, the step was captured with false/);
    assert.match(reasons[2], /^the model's checkpoint is null, the step was captured with 2$/);
    assert.match(reasons[3], /^parameter 0\.weight was frozen$/);
  },
});

/** A model that grows a layer when told (a parameter registered after capture). */
class Growing extends Module {
  readonly first = this.registerModule("first", new Linear(12, 5, { seed: 1 }));
  extra: Linear | null = null;
  grow(): void {
    this.extra = this.registerModule("extra", new Linear(5, 5, { seed: 2 }));
  }
  forward(x: Tensor): Tensor {
    const h = this.first.forward(x);
    if (!this.extra) return h;
    const out = this.extra.forward(h);
    h.dispose();
    return out;
  }
}

Deno.test({
  name: "capture guards: a module registered after capture captures again",
  ...GPU_TEST,
  fn() {
    const model = new Growing();
    const trainer = new AmpTrainer(model, new AdamW(model.parameters()));
    const reasons: string[] = [];
    const step = trainer.capture((x, y) => crossEntropy(model.forward(x), y), {
      onRecapture: (r) => reasons.push(r),
    });
    for (let i = 0; i < 8; i++) {
      if (i === 4) model.grow();
      const [x, y] = makeBatch(AMP, i);
      step.run(x, y).dispose();
    }
    assert.deepEqual(reasons, ["a parameter, buffer or module was registered on the model"]);
    assert.equal(step.stats.captures, 2);
    trainer.dispose();
    model.dispose();
  },
});

Deno.test({
  name: "capture guards: the tuner picking another kernel at a wait captures again",
  ...GPU_TEST,
  async fn() {
    const fastest = JSON.stringify(matmulCandidates(gpu, "f32")[2]);
    await withLazyTuning({ fastest }, async () => {
      // 96 × 128 × 80 multiply-adds: worth tuning.
      const model = new Linear(128, 80, { seed: 1 });
      const trainer = new AmpTrainer(model, new AdamW(model.parameters()), { enabled: false });
      const reasons: string[] = [];
      const step = trainer.capture((x, y) => crossEntropy(model.forward(x), y), {
        onRecapture: (r) => reasons.push(r),
      });
      const x = Tensor.from(new Float32Array(96 * 128).map((_, i) => (i % 7) / 7), [96, 128]);
      const y = Tensor.from(Array.from({ length: 96 }, (_, i) => i % 80), [96], { dtype: "i32" });
      for (let i = 0; i < 3; i++) step.run(x, y).dispose();
      assert.ok(step.captured);
      const picks = matmulSettings.of(gpu).classTilings.size;
      await step.run(x, y).item(); // the wait: the noted classes are tuned
      assert.ok(matmulSettings.of(gpu).classTilings.size > picks, "the tuner picked");
      for (let i = 0; i < 3; i++) step.run(x, y).dispose();
      assert.deepEqual(reasons, ["the tuner picked other kernels"]);
      assert.equal(step.stats.captures, 2);
      for (const t of [x, y, model]) t.dispose();
      trainer.dispose();
    });
  },
});

Deno.test({
  name: "capture guards: a tensor the step uses, freed, captures again; a pool reset " +
    "between replays changes nothing",
  ...GPU_TEST,
  async fn() {
    const weights = (i: number) => Tensor.from([1, 2, 1, 0.5, 1 + i / 10], [5]);
    let weight = { eager: weights(0), captured: weights(0) };
    const setup: RunSetup = { ...AMP, dropout: false };
    const eager = makeRun(setup), captured = makeRun(setup);
    const reasons: string[] = [];
    const step = captured.trainer.capture(
      (x, y) => crossEntropy(captured.model.forward(x), y, { weight: weight.captured }),
      { onRecapture: (r) => reasons.push(r) },
    );
    const losses: [Tensor[], Tensor[]] = [[], []];
    for (let i = 0; i < 14; i++) {
      if (i === 5) gpu.pool.releaseCached();
      if (i === 8) {
        weight.eager.dispose();
        weight.captured.dispose();
        weight = { eager: weights(i), captured: weights(i) };
      }
      const [x, y] = makeBatch(setup, i);
      losses[0].push(
        eager.trainer.step(() => crossEntropy(eager.model.forward(x), y, { weight: weight.eager })),
      );
      losses[1].push(step.run(x, y));
      x.dispose();
      y.dispose();
    }
    assert.deepEqual(reasons, ["a tensor the captured step uses was freed"]);
    assert.deepEqual(await lossBits(losses[1]), await lossBits(losses[0]));
    assert.deepEqual(await snapshot(captured), await snapshot(eager));
    weight.eager.dispose();
    weight.captured.dispose();
    disposeRun(eager);
    disposeRun(captured);
  },
});

Deno.test({
  name: "capture guards: targets that start to hold the ignore index capture again",
  ...GPU_TEST,
  async fn() {
    const setup: RunSetup = { ...AMP, dropout: false };
    const reasons = await sideBySide(setup, 12, () => {}, (i) => {
      const [x, y] = makeBatch(setup, i);
      if (i < 6) return [x, y];
      y.dispose();
      const labels = Array.from({ length: 6 }, (_, r) => (r === 2 ? -100 : (r + i) % 5));
      return [x, Tensor.from(labels, [6], { dtype: "i32" })];
    });
    assert.deepEqual(reasons, ["whether the targets may hold the ignore index -100 changed"]);
  },
});

Deno.test({
  name: "capture guards: eager steps inside an accumulation cycle, between replays, give " +
    "the same run",
  ...GPU_TEST,
  async fn() {
    const setup: RunSetup = { ...AMP, accumulation: 4, schedule: true };
    const eager = makeRun(setup), mixed = makeRun(setup);
    const step = mixed.trainer.capture(mixed.loss, {
      onRecapture: (r) => assert.fail(`recaptured: ${r}`),
    });
    // Eager micro-batches at positions 1, 2, 3, 3 of the cycle (then replays go on), and at
    // position 0 (its gradients are new: the rest of that cycle runs eagerly).
    const eagerAt = new Set([17, 22, 27, 31, 36]);
    for (let i = 0; i < 48; i++) {
      const [x, y] = makeBatch(setup, i);
      for (const [run, captured] of [[eager, false], [mixed, !eagerAt.has(i)]] as const) {
        const steps = run.trainer.steps;
        const loss = captured ? step.run(x, y) : run.trainer.step(() => run.loss(x, y));
        loss.dispose();
        if (run.trainer.steps !== steps) run.scheduler!.step();
      }
      if (i === 22) {
        // Mid-cycle the gradients are visible, as eagerly.
        const a = await eager.model.parameters()[0].grad!.read();
        const b = await mixed.model.parameters()[0].grad!.read();
        assert.deepEqual(new Uint8Array(b.buffer), new Uint8Array(a.buffer));
      }
      x.dispose();
      y.dispose();
    }
    assert.deepEqual({ ...step.stats, lastRecapture: null, reservedBytes: 0, dispatches: 0 }, {
      replayed: 48 - 12 - 5 - 3,
      recorded: 12,
      eager: 3,
      captures: 1,
      lastRecapture: null,
      reservedBytes: 0,
      dispatches: 0,
    });
    assert.deepEqual(await snapshot(mixed), await snapshot(eager));
    disposeRun(eager);
    disposeRun(mixed);
  },
});

Deno.test({
  name: "capture refusals: a read, a host branch and data uploaded from JavaScript are " +
    "refused in one line",
  ...GPU_TEST,
  fn() {
    const cases: [string, (run: Run) => (x: Tensor, y: Tensor) => Tensor, RegExp][] = [
      ["a read", (run) => (x, y) => {
        const loss = run.loss(x, y);
        void loss.read();
        return loss;
      }, /cannot be captured: it reads the GPU/],
      ["a host branch", (run) => {
        let calls = 0;
        return (x, y) => {
          const loss = run.loss(x, y);
          return calls++ % 2 === 0 ? loss : scale(loss, 2);
        };
      }, /does different work every time it runs \(command \d+ .*\): it branches on host/],
      ["labels from JavaScript", (run) => {
        let calls = 0;
        return (x) =>
          crossEntropy(
            run.model.forward(x),
            Array.from({ length: 6 }, (_, r) => (r + calls++) % 5),
          );
      }, /does different work every time.*other bytes written from the host/],
    ];
    for (const [what, loss, message] of cases) {
      const run = makeRun(AMP);
      const step = run.trainer.capture(loss(run));
      assert.throws(
        () => {
          for (let i = 0; i < 6; i++) step.run(...makeBatch(AMP, i)).dispose();
        },
        (e: Error) =>
          e instanceof StateError && message.test(e.message) && !e.message.includes("\n"),
        what,
      );
      disposeRun(run);
    }
  },
});

Deno.test({
  name: "capture refusals: an id out of range in a later batch throws as eagerly, and " +
    "changes nothing",
  ...GPU_TEST,
  async fn() {
    const run = makeRun(AMP);
    const step = run.trainer.capture(run.loss);
    for (let i = 0; i < 4; i++) step.run(...makeBatch(AMP, i)).dispose();
    assert.ok(step.captured);
    const [x] = makeBatch(AMP, 4);
    const bad = Tensor.from([0, 1, 7, 2, 3, 4], [6], { dtype: "i32" });
    const eagerError = (() => {
      try {
        run.trainer.step(() => run.loss(x, bad));
        return null;
      } catch (e) {
        return e as Error;
      }
    })();
    assert.ok(eagerError instanceof ValueError, "the eager step refuses it first");
    const before = await snapshot(run); // (the eager attempt drew its dropout mask first)
    assert.throws(() => step.run(x, bad), (e: Error) => e.message === eagerError!.message);
    assert.deepEqual(await snapshot(run), before, "nothing ran");
    for (const t of [x, bad]) t.dispose();
    disposeRun(run);
  },
});

Deno.test({
  name: "capture refusals: a trainer with a numerics inspector, an async step, a lost device",
  ...GPU_TEST,
  async fn() {
    const run = makeRun(AMP);
    const inspected = new AmpTrainer(run.model, run.optimizer, {
      inspector: new NumericsInspector(run.model),
    });
    assert.throws(() => inspected.capture(run.loss), /NumericsInspector cannot capture/);
    const step = run.trainer.capture((async () => {}) as unknown as () => Tensor);
    assert.throws(() => step.run(...makeBatch(AMP, 0)), /a promise \(an async function\)/);
    disposeRun(run);

    const other = await initGpu({ matmulTiling: "default", setDefault: false });
    const model = new Linear(3, 2, { seed: 1, gpu: other });
    const trainer = new AmpTrainer(model, new AdamW(model.parameters()));
    const lost = trainer.capture((x, y) => crossEntropy(model.forward(x), y));
    const x = Tensor.from([1, 2, 3, 4, 5, 6], [2, 3], { gpu: other });
    const y = Tensor.from([0, 1], [2], { dtype: "i32", gpu: other });
    for (let i = 0; i < 3; i++) lost.run(x, y).dispose();
    other.device.destroy(); // as a driver reset would lose it
    await new Promise((r) => setTimeout(r, 50));
    assert.throws(
      () => lost.run(x, y),
      (e: Error) => e instanceof GpuError && /lost/.test(e.message),
    );
    other.destroy();
  },
});
