/**
 * Training-state files load all or nothing (issue 26, findings 3 and 12): a
 * file that does not fit the live objects — another optimizer, scaler,
 * corrupt counters, a bad `extra`, a gradient of the wrong shape, a dropped
 * gradient, an unknown tensor, a negative second moment — is refused with
 * one short HalfstepError line, and every piece of state (weights, buffers,
 * gradients, working copies, optimizer, scaler, trainer, random generators)
 * stays bit-identical. A good file restores all of it. Saving a diverged run
 * is refused (finding 1).
 */
import assert from "node:assert/strict";
import { decodeSafetensors } from "../../nn/mod.ts";
import {
  cosineSchedule,
  Dropout,
  HalfstepError,
  Linear,
  LrScheduler,
  RandomGenerator,
  Sequential,
  Tensor,
  ValueError,
} from "../../mod.ts";
import { loadTrainingState, saveTrainingState } from "../../files.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import {
  ampRun,
  type FileParts,
  rewrite,
  type Run,
  snapshot,
  train,
} from "../helpers/training_state.ts";

const dir = await Deno.makeTempDir();
const good = `${dir}/good.safetensors`;
// Saved mid-accumulation (2 optimizer steps and 1 of 2 micro-batches): gradients are in the file.
const source = ampRun(1);
train(source, 0, 5);
await saveTrainingState(good, source);

/** A live run whose every piece of state differs from the file's. */
function target(): Run {
  const run = ampRun(2);
  train(run, 50, 3);
  return run;
}

const trainerField = (key: string, value: unknown) => (f: FileParts) => {
  f.metadata.trainer = JSON.stringify({ ...JSON.parse(f.metadata.trainer), [key]: value });
};
/** The optimizer metadata, as PyTorch's state_dict lays it out. */
interface TorchOptimizerJson {
  kind: string;
  state: Record<string, Record<string, unknown>>;
  param_groups: Record<string, unknown>[];
  halfstep: Record<string, unknown>;
}
const optimizerMeta = (edit: (o: TorchOptimizerJson) => void) => (f: FileParts) => {
  const o = JSON.parse(f.metadata.optimizer);
  edit(o);
  f.metadata.optimizer = JSON.stringify(o);
};
const setFloat = (name: string, index: number, value: number) => (f: FileParts) => {
  const e = f.entries.get(name)!;
  new DataView(e.data.buffer, e.data.byteOffset).setFloat32(4 * index, value, true);
};

const cases: { name: string; run?: () => Run; edit?: (f: FileParts) => void; error: RegExp }[] = [
  {
    name: "AdamW state into SGD",
    run: () => sgdTarget(),
    error: /it holds the state of AdamW, the optimizer given is SGD/,
  },
  {
    name: "a scaler of the other mode",
    run: () => scalerOffTarget(),
    error: /AMP trainer state.*enabled/,
  },
  { name: 'trainer.steps "abc"', edit: trainerField("steps", "abc"), error: /steps must be/ },
  { name: "trainer.steps -5", edit: trainerField("steps", -5), error: /steps must be/ },
  { name: "trainer.steps 1.5", edit: trainerField("steps", 1.5), error: /steps must be/ },
  { name: "trainer.micro_step 2 of 2", edit: trainerField("micro_step", 2), error: /microStep/ },
  {
    name: "a bf16 run into an f16 trainer",
    edit: trainerField("dtype", "bf16"),
    error: /saved in bf16 and this trainer runs f16: create it with \{ dtype: "bf16" \}/,
  },
  {
    name: "an f32 run (AMP off) into an f16 trainer",
    edit: trainerField("dtype", "f32"),
    error:
      /saved in f32 \(AMP off\) and this trainer runs f16: create it with \{ enabled: false \}/,
  },
  { name: 'trainer.dtype "f8"', edit: trainerField("dtype", "f8"), error: /dtype must be/ },
  {
    name: "scaler metadata null",
    edit: (f) => (f.metadata.scaler = "null"),
    error: /scaler metadata/,
  },
  {
    name: "a scale of -1",
    edit: (f) => (f.metadata.scaler = f.metadata.scaler.replace(/"scale":\d+/, '"scale":-1')),
    error: /AMP trainer state.*scale must be a positive/,
  },
  {
    name: "a growth tracker at the growth interval",
    edit: (
      f,
    ) => (f.metadata.scaler = f.metadata.scaler.replace(
      /"_growth_tracker":\d+/,
      '"_growth_tracker":2',
    )),
    error: /growthTracker 2 must be below 2/,
  },
  {
    name: "trainer metadata null",
    edit: (f) => (f.metadata.trainer = "null"),
    error: /trainer metadata is not an object/,
  },
  {
    name: "truncated trainer JSON",
    edit: (f) => (f.metadata.trainer = f.metadata.trainer.slice(0, 9)),
    error: /trainer metadata is not valid JSON/,
  },
  {
    name: "bad extra",
    edit: (f) => (f.metadata.extra = "{bad"),
    error: /extra metadata is not valid JSON/,
  },
  {
    name: "a gradient of the wrong shape",
    edit: (f) => (f.entries.get("grad.0.weight")!.shape = [6, 16]),
    error: /gradient of "0.weight"/,
  },
  {
    name: "a gradient of the wrong dtype",
    edit: (f) =>
      f.entries.set("grad.4.bias", { dtype: "f16", shape: [3], data: new Uint8Array(6) }),
    error: /gradient of "4.bias"/,
  },
  {
    name: "a dropped gradient mid-accumulation",
    edit: (f) => f.entries.delete("grad.0.bias"),
    error: /gradient of "0.bias" is missing/,
  },
  {
    name: "an unknown tensor",
    edit: (f) => f.entries.set("junk", { dtype: "f32", shape: [1], data: new Uint8Array(4) }),
    error: /unknown tensor "junk"/,
  },
  {
    name: "a negative exp_avg_sq",
    edit: setFloat("optimizer.state.0.exp_avg_sq", 5, -1e-3),
    error: /expAvgSq holds 1 negative/,
  },
  {
    name: "a NaN moment",
    edit: setFloat("optimizer.state.1.exp_avg", 0, NaN),
    error: /non-finite/,
  },
  {
    name: "a parameter state that is not an object",
    edit: optimizerMeta((o) => (o.state[0] = 5 as unknown as Record<string, unknown>)),
    error: /optimizer state 0 is malformed/,
  },
  {
    name: "a missing optimizer buffer",
    edit: (f) => f.entries.delete("optimizer.state.1.exp_avg"),
    error: /"optimizer.state.1.exp_avg" is missing/,
  },
  {
    name: "a moment of the wrong shape",
    edit: (f) => (f.entries.get("optimizer.state.0.exp_avg")!.shape = [6, 16]),
    error: /"optimizer.state.0.exp_avg" is f32 \[6, 16\], not f32 \[16, 6\]/,
  },
  {
    name: "per-parameter step counts that differ",
    edit: optimizerMeta((o) => (o.state[2] = { step: 7 })),
    error: /step counts differ; halfstep's Adam keeps one step for all/,
  },
  {
    name: "group params that are not a list",
    edit: optimizerMeta((o) => (o.param_groups[0].params = 5)),
    error: /group 0's params are not a list of parameter indices/,
  },
  {
    name: "an AdamW file whose group says its weight decay is not decoupled",
    edit: optimizerMeta((o) => (o.param_groups[0].decoupled_weight_decay = 1)),
    error: /group 0 has "decoupled_weight_decay" = "1"/,
  },
  {
    name: "amsgrad",
    edit: optimizerMeta((o) => (o.param_groups[0].amsgrad = true)),
    error: /group 0 has "amsgrad" = "true", which halfstep's AdamW does not implement/,
  },
  {
    name: "the state of Adam (L2 weight decay) into AdamW",
    edit: optimizerMeta((o) => (o.kind = "Adam")),
    error: /it holds the state of Adam, the optimizer given is AdamW/,
  },
  {
    name: "an optimizer kind halfstep lacks",
    edit: optimizerMeta((o) => (o.kind = "RMSprop")),
    error: /its optimizer is "RMSprop", not one halfstep has/,
  },
  {
    name: "an Adam without bias correction into one with",
    edit: optimizerMeta((o) => (o.halfstep = { bias_correction: false })),
    error: /setting biasCorrection is false/,
  },
  {
    name: "a scheduler step of -1",
    run: () => scheduled(target()),
    edit: (f) => (f.metadata.scheduler = JSON.stringify({ base_lrs: [1], last_epoch: -1 })),
    error: /LR scheduler state does not fit.*step must be an integer >= 0/,
  },
  {
    name: "a random generator offset of the wrong type",
    edit: (
      f,
    ) => (f.metadata.random = JSON.stringify([{ at: ["3:generator"], seed: 1, offset: "x" }])),
    error: /random generator 0.*offset \(string\)/,
  },
  {
    name: "no random generators",
    edit: (f) => (f.metadata.random = "[]"),
    error: /0 random generator state\(s\), the model has 1/,
  },
  {
    name: "a weight of the wrong shape",
    edit: (f) => (f.entries.get("model.4.weight")!.shape = [16, 3]),
    error: /model state does not fit/,
  },
  {
    name: "a 1 MB tensor name",
    edit: (f) =>
      f.entries.set(`model.${"x".repeat(1 << 20)}`, {
        dtype: "f32",
        shape: [1],
        data: new Uint8Array(4),
      }),
    error: /model state does not fit/,
  },
];

/** `run` with the cosine LR scheduler of the format-2 fixtures. */
function scheduled(run: Run): Run & { scheduler: LrScheduler } {
  return {
    ...run,
    scheduler: new LrScheduler(run.optimizer, cosineSchedule({ warmupSteps: 1, totalSteps: 20 })),
  };
}

function sgdTarget(): Run {
  const run = ampRun(2, { sgd: true });
  train(run, 50, 3);
  return run;
}

function scalerOffTarget(): Run {
  const run = ampRun(2, { trainer: { scaler: { enabled: false } } });
  train(run, 50, 3);
  return run;
}

for (const c of cases) {
  Deno.test({
    name: `loadTrainingState refuses ${c.name} with one line and changes nothing`,
    ...GPU_TEST,
    async fn() {
      const path = `${dir}/mutant.safetensors`;
      await rewrite(good, path, c.edit ?? (() => {}));
      const run = (c.run ?? target)();
      const before = await snapshot(run);
      const e = await loadTrainingState(path, run).then(() => null, (e: Error) => e);
      assert.deepEqual(await snapshot(run), before, "every piece of state is unchanged");
      assert.ok(e, "the load is refused");
      assert.ok(e instanceof HalfstepError, `${e.name}: ${e.message.slice(0, 300)}`);
      assert.ok(!e.message.includes("\n"), `one line: ${e.message.slice(0, 600)}`);
      assert.ok(e.message.length < 500, `short: ${e.message.length} characters`);
      assert.match(e.message, c.error);
      assert.match(e.message, /nothing was loaded\.$/);
      run.trainer.dispose();
      run.optimizer.dispose();
    },
  });
}

Deno.test({
  name: "loadTrainingState restores every piece of state, the Dropout generator included",
  ...GPU_TEST,
  async fn() {
    const run = target();
    assert.equal(await loadTrainingState(good, run), null);
    assert.deepEqual(await snapshot(run), await snapshot(source));
  },
});

Deno.test({
  name:
    "an AdamW state from a newer PyTorch (AdamW is Adam with decoupled_weight_decay: true) loads",
  ...GPU_TEST,
  async fn() {
    const path = `${dir}/newer_torch.safetensors`;
    await rewrite(
      good,
      path,
      optimizerMeta((o) => o.param_groups.forEach((g) => (g.decoupled_weight_decay = true))),
    );
    const run = target();
    assert.equal(await loadTrainingState(path, run), null);
    assert.deepEqual(await snapshot(run), await snapshot(source));
  },
});

Deno.test({
  name: "a generator shared by several modules is saved once and restored where it stood",
  ...GPU_TEST,
  async fn() {
    const path = `${dir}/shared.safetensors`;
    const make = (seed: number) => {
      const shared = new RandomGenerator(seed);
      const layers = [new Dropout(0.5, { seed: shared }), new Dropout(0.2, { seed: shared })];
      return new Sequential(new Linear(4, 4, { seed: shared }), ...layers);
    };
    const generators = (m: Sequential) =>
      m.children().slice(1).map((d) => (d as Dropout).generator);
    const saved = make(1);
    saved.forward(Tensor.full([2, 4], 1)).dispose();
    await saveTrainingState(path, { model: saved });
    const { metadata } = decodeSafetensors(await Deno.readFile(path));
    assert.deepEqual(JSON.parse(metadata.random), [
      { at: ["1:generator", "2:generator"], ...generators(saved)[0].state() },
    ]);
    const resumed = make(9);
    await loadTrainingState(path, { model: resumed });
    const [first, second] = generators(resumed);
    assert.equal(first, second, "still one stream");
    assert.deepEqual(first.state(), generators(saved)[0].state());
    const moved = new Sequential(new Linear(4, 4), new Dropout(0.5), new Dropout(0.2, { seed: 3 }));
    await assert.rejects(
      loadTrainingState(path, { model: moved }),
      /it holds 1 random generator state\(s\), the model has 2 generator\(s\)/,
    );
  },
});

Deno.test({
  name:
    "an SGD run is saved as torch.optim.SGD's state_dict; dampening it cannot honour is refused",
  ...GPU_TEST,
  async fn() {
    const path = `${dir}/sgd.safetensors`, mutant = `${dir}/sgd_dampening.safetensors`;
    const sgd = ampRun(3, { sgd: true });
    train(sgd, 0, 4);
    await saveTrainingState(path, sgd);
    const { metadata, entries } = decodeSafetensors(await Deno.readFile(path));
    const optimizer = JSON.parse(metadata.optimizer);
    assert.equal(optimizer.kind, "SGD");
    // The keys torch 1.13's SGD writes (torch.optim.SGD(params, lr=0.1).state_dict()).
    const torchKeys = ["lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"];
    const keys = [...torchKeys, "foreach", "differentiable", "params"];
    assert.deepEqual(Object.keys(optimizer.param_groups[0]).sort(), keys.sort());
    assert.deepEqual(optimizer.state[0], {});
    assert.ok(entries.has("optimizer.state.0.momentum_buffer"));
    await rewrite(path, mutant, optimizerMeta((o) => (o.param_groups[0].dampening = 0.5)));
    const run = sgdTarget(), before = await snapshot(run);
    await assert.rejects(
      loadTrainingState(mutant, run),
      /"dampening" = "0.5", which halfstep's SGD does not implement; nothing was loaded/,
    );
    assert.deepEqual(await snapshot(run), before);
    await loadTrainingState(path, run);
    assert.deepEqual(await snapshot(run), await snapshot(sgd));
  },
});

/**
 * Files of format 2, halfstep's own vocabulary, written by saveTrainingState
 * at commit f48e404 (just before the PyTorch layout): an AdamW and an SGD run
 * (tests/helpers/training_state.ts, seed 1) with a cosine scheduler, saved after 5
 * micro-batches (mid-accumulation) with `extra: { epoch: 1 }`.
 */
const FORMAT_2 = ["adamw", "sgd"].map((kind) => ({
  kind,
  path: new URL(`../fixtures/training_state_v2_${kind}.safetensors`, import.meta.url).pathname,
}));

for (const { kind, path } of FORMAT_2) {
  Deno.test({
    name: `a file of format 2 (${kind}) loads every value it holds, and saves again losslessly`,
    ...GPU_TEST,
    async fn() {
      const file = decodeSafetensors(await Deno.readFile(path));
      assert.equal(file.metadata.format, "halfstep-training-state-2");
      const make = () => scheduled(kind === "sgd" ? sgdTarget() : target());
      const run = make();
      assert.deepEqual(await loadTrainingState(path, run), { epoch: 1 });
      const state = await snapshot(run);
      for (const [name, e] of file.entries) {
        const [part, ...rest] = name.split(".");
        if (part === "optimizer") {
          const [param, buffer] = rest;
          const o = state.optimizer as { state: { buffers: Record<string, Uint8Array> }[] };
          assert.deepEqual(o.state[Number(param)].buffers[buffer], e.data, name);
        } else assert.deepEqual(state[name], e.data, name);
      }
      const saved = JSON.parse(file.metadata.optimizer),
        trainer = JSON.parse(file.metadata.trainer);
      const { state: _, ...counters } = saved;
      const { state: __, ...loaded } = state.optimizer as Record<string, unknown>;
      assert.deepEqual(loaded, counters, "kind, settings, step and groups");
      // Format 2 did not record the dtype; the trainer that loads it reports its own.
      assert.deepEqual(state.trainer, { ...trainer, dtype: "f16" }, "the trainer and its scaler");
      const scheduler = JSON.parse(file.metadata.scheduler);
      assert.deepEqual(run.scheduler.stateDict().baseLrs, scheduler.baseLrs);
      assert.equal(run.scheduler.stepCount, scheduler.step);
      const [{ seed, offset }] = JSON.parse(file.metadata.random);
      assert.deepEqual(state.dropout, { seed, offset }, "the Dropout generator");
      // Saved again (in the current format) and loaded into a third run: bit-identical.
      const again = `${dir}/from_format2_${kind}.safetensors`;
      await saveTrainingState(again, run, { extra: { epoch: 1 } });
      const copy = make();
      assert.deepEqual(await loadTrainingState(again, copy), { epoch: 1 });
      assert.deepEqual(await snapshot(copy), state);
      assert.equal(copy.scheduler.stepCount, run.scheduler.stepCount);
      for (const r of [run, copy]) (r.trainer.dispose(), r.optimizer.dispose());
    },
  });
}

Deno.test({
  name:
    "a file of format 1 (no list of gradients, no generators) still loads, generators untouched",
  ...GPU_TEST,
  async fn() {
    const path = `${dir}/format1.safetensors`;
    await rewrite(FORMAT_2[0].path, path, (f) => {
      f.metadata.format = "halfstep-training-state-1";
      delete f.metadata.grads;
      delete f.metadata.random;
    });
    const run = target(), reference = target();
    const { dropout: generator } = await snapshot(run);
    await loadTrainingState(path, run);
    await loadTrainingState(FORMAT_2[0].path, reference);
    const { dropout, ...loaded } = await snapshot(run);
    const { dropout: _, ...saved } = await snapshot(reference);
    assert.deepEqual(loaded, saved);
    assert.deepEqual(dropout, generator);
  },
});

Deno.test({
  name: "saveTrainingState refuses NaN weights or moments (naming the tensor) and keeps the file",
  ...GPU_TEST,
  async fn() {
    const path = `${dir}/diverged.safetensors`;
    const run = target();
    await saveTrainingState(path, run);
    const kept = await Deno.readFile(path);
    const weight = run.model.stateDict().get("4.weight")!;
    const values = await weight.read();
    values[2] = NaN;
    weight.writeBytes(new Uint8Array(values.buffer));
    await assert.rejects(saveTrainingState(path, run), (e: Error) => {
      assert.ok(e instanceof ValueError && !e.message.includes("\n"), e.message);
      assert.match(e.message, /^saveTrainingState: .*"model\.4\.weight" holds 1 non-finite value/);
      return true;
    });
    assert.deepEqual(await Deno.readFile(path), kept, "the good file is untouched");
    values[2] = 0;
    weight.writeBytes(new Uint8Array(values.buffer));
    run.trainer.masters!.refresh(); // the working copy follows its master, as after a step
    const state = await run.optimizer.stateDict();
    state.state[1].buffers.expAvg[0] = Infinity;
    run.optimizer.loadStateDict(state, { allowNonFinite: true });
    await assert.rejects(
      saveTrainingState(path, run),
      /"optimizer\.state\.1\.exp_avg" holds 1 non-finite/,
    );
    assert.deepEqual(await Deno.readFile(path), kept, "the good file is untouched");
    await saveTrainingState(path, run, { allowNonFinite: true, extra: { epoch: 2 } });
    const copy = target();
    assert.deepEqual(await loadTrainingState(path, copy, { allowNonFinite: true }), { epoch: 2 });
    assert.deepEqual(await snapshot(copy), await snapshot(run));
    await assert.rejects(
      saveTrainingState(path, run, { epoch: 3 } as never),
      /unknown option epoch \(known: extra, allowNonFinite\)/,
    );
  },
});

Deno.test({ name: "(cleanup)", ...GPU_TEST, fn: () => Deno.remove(dir, { recursive: true }) });
