/**
 * The numerics inspector: its counts against a CPU f64 count over the same
 * tensors read back, the first non-finite op named (forward, backward, under
 * AmpTrainer with the step skipped), and nothing changed when it is not
 * attached (same dispatches, same bits, no read before `report()`).
 */
import assert from "node:assert/strict";
import {
  AmpTrainer,
  checkpoint,
  crossEntropy,
  type NumericsCounts,
  NumericsInspector,
  reshape,
  scale,
  Sequential,
  SGD,
  StateError,
  Tensor,
  ValueError,
} from "../../mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { uniform } from "../helpers/reference.ts";
import { batch, CLASSES, FEATURES, LABELS, mlp, plant } from "../helpers/inspector_model.ts";
import { capturedWarnings } from "../helpers/warnings.ts";

const F16_MAX = 65504, F16_MIN_NORMAL = 2 ** -14;

/** The inspector's counts, computed in f64 from values read back, over `calls` equal tensors. */
function cpuCounts(values: ArrayLike<number>, calls = 1): NumericsCounts {
  let nonFinite = 0, overflowF16 = 0, underflowF16 = 0, zeros = 0, amax = 0;
  for (let i = 0; i < values.length; i++) {
    const a = Math.abs(values[i]);
    if (!Number.isFinite(a)) {
      nonFinite++;
      continue;
    }
    if (a > F16_MAX) overflowF16++;
    if (a === 0) zeros++;
    else if (a < F16_MIN_NORMAL) underflowF16++;
    amax = Math.max(amax, a);
  }
  return {
    calls,
    values: calls * values.length,
    nonFinite: calls * nonFinite,
    overflowF16: calls * overflowF16,
    underflowF16: calls * underflowF16,
    zeros: calls * zeros,
    amax,
  };
}

/** `n` values with planted specials: NaN, ±Inf, f16 overflows and underflows, ±0. */
function plantedValues(n: number, seed: number): Float64Array {
  const x = uniform(n, seed, -300, 300);
  const specials = [NaN, Infinity, -Infinity, 7e4, -1e6, 65505, 1e-5, -3e-7, 1e-40, 0, -0, 6e-8];
  // Spread over every workgroup (1024 words each), the odd last element included.
  for (let i = 0; i < 3 * specials.length; i++) {
    x[(i * 997 + 13) % n] = specials[i % specials.length];
  }
  x[n - 1] = -Infinity;
  return x;
}

function countsOf<T extends NumericsCounts>(row: T | undefined): NumericsCounts {
  assert.ok(row, "the row exists");
  const { calls, values, nonFinite, overflowF16, underflowF16, zeros, amax } = row;
  return { calls, values, nonFinite, overflowF16, underflowF16, zeros, amax };
}

const dtypes = [
  { dtype: "f32" as const, ignore: false },
  { dtype: "f16" as const, ignore: !gpu.f16 },
  { dtype: "bf16" as const, ignore: false },
];
for (const { dtype, ignore } of dtypes) {
  Deno.test({
    name: `NumericsInspector: ${dtype} counts equal a CPU f64 count of the same tensors, ` +
      `forward and backward${ignore ? " (ignored: no shader-f16)" : ""}`,
    ignore,
    ...GPU_TEST,
    async fn() {
      const n = 5001; // five f32 workgroups, three f16 / bf16 ones, an odd half tail
      const inspector = new NumericsInspector(new Sequential());
      const x = Tensor.from(plantedValues(n, 1), [n], { dtype, requiresGrad: true });
      const g = Tensor.from(plantedValues(n, 2), [1, n], { dtype });
      // reshape's output shares x's memory, and its rule passes g on: the counted
      // tensors are exactly x and g.
      inspector.watch(() => reshape(x, [1, n]).backward({ gradient: g }));
      const report = await inspector.report();
      const row = (phase: string) =>
        report.rows.find((r) => r.name === "reshape:0" && r.phase === phase);
      assert.equal(row("forward")?.dtype, dtype);
      const forward = cpuCounts(await x.read());
      assert.ok(forward.nonFinite >= 4 && forward.underflowF16 >= 3 && forward.zeros >= 6);
      if (dtype !== "f16") assert.ok(forward.overflowF16 >= 6);
      assert.deepEqual(countsOf(row("forward")), forward);
      assert.deepEqual(countsOf(row("backward")), cpuCounts(await x.grad!.read()));
      assert.deepEqual(report.firstNonFinite, {
        step: 0,
        name: "reshape:0",
        op: "reshape",
        phase: "forward",
        call: 0,
        scale: null,
      });
      inspector.dispose();
      x.dispose();
      g.dispose();
    },
  });
}

Deno.test({
  name:
    "NumericsInspector: rows past the first buffer's 64 keep their counts when it grows mid-step",
  ...GPU_TEST,
  async fn() {
    const n = 777;
    const inspector = new NumericsInspector(new Sequential());
    // WGSL lets arithmetic flush f32 subnormals, and Dawn's does on lavapipe: a scaling by 1 is
    // exact only on normal values, so the f32 subnormal among the planted ones becomes an f16
    // underflow that is a normal f32 (the test above counts subnormals as stored).
    const planted = (seed: number) =>
      plantedValues(n, seed).map((v) => (v !== 0 && Math.abs(v) < 2 ** -126 ? 1e-30 : v));
    const x = Tensor.from(planted(3), [n], { requiresGrad: true });
    const g = Tensor.from(planted(4), [n]);
    // 40 exact scalings (by 1) forward and 40 backward: 80 rows, each counting x or g.
    const chain = () => {
      let h = x;
      for (let i = 0; i < 40; i++) h = scale(h, 1);
      h.backward({ gradient: g });
    };
    inspector.watch(chain);
    inspector.watch(chain);
    const report = await inspector.report();
    assert.equal(report.rows.length, 80);
    const [forward, backward] = [cpuCounts(await x.read(), 2), cpuCounts(await g.read(), 2)];
    for (const row of report.rows) {
      assert.deepEqual(countsOf(row), row.phase === "forward" ? forward : backward, row.name);
    }
    inspector.dispose();
    x.dispose();
    g.dispose();
  },
});

/** `forward*` methods left on module instances (the inspector's wrappers while watching). */
const wrapped = (model: Sequential) =>
  model.namedModules().flatMap(([, m]) =>
    Object.getOwnPropertyNames(m).filter((k) => k.startsWith("forward"))
  );
Deno.test({
  name: "NumericsInspector: an Inf planted in one layer's weights is named, forward, at its step",
  ...GPU_TEST,
  async fn() {
    const model = mlp(1);
    const inspector = new NumericsInspector(model);
    const x = batch();
    const step = () => crossEntropy(model.forward(x), LABELS).backward();
    inspector.watch(step); // step 0: clean
    model.zeroGrad();
    await plant(model.stateDict().get("2.weight")!, 5, Infinity);
    const reads = gpu.batch.counters.reads;
    inspector.watch(step); // step 1: layer "2" breaks
    inspector.watch(step); // step 2: still broken, but not the first
    assert.equal(gpu.batch.counters.reads, reads, "nothing read back before report()");
    const report = await inspector.report();
    assert.equal(report.steps, 3);
    assert.deepEqual(report.firstNonFinite, {
      step: 1,
      name: "2",
      op: "linear",
      phase: "forward",
      call: 0,
      scale: null,
    });
    const row = (name: string, phase: string) =>
      report.rows.find((r) => r.name === name && r.op === "linear" && r.phase === phase)!;
    assert.equal(row("0", "forward").nonFinite, 0, "layers before it stay finite");
    assert.equal(row("0", "forward").calls, 3);
    assert.ok(row("2", "forward").nonFinite > 0);
    assert.ok(row("4", "backward").nonFinite > 0, "its NaN reaches the gradients");
    assert.deepEqual(report.ops.find((o) => o.op === "linear")?.calls, { f32: 9 });
    const weight = report.params.find((p) => p.name === "4.weight")!;
    assert.equal(weight.calls, 3);
    assert.equal(weight.values, 3 * 8 * CLASSES);
    model.dispose();
    inspector.dispose();
    x.dispose();
  },
});

Deno.test({
  name: "NumericsInspector: each parameter's gradient counts equal a CPU count of its .grad, " +
    "with the share that underflows f16",
  ...GPU_TEST,
  async fn() {
    const model = mlp(7);
    const inspector = new NumericsInspector(model);
    const x = batch();
    // A tiny loss gives gradients that f16 could not hold as normal numbers.
    inspector.watch(() => scale(crossEntropy(model.forward(x), LABELS), 1e-4).backward());
    const report = await inspector.report();
    assert.deepEqual(report.params.map((p) => p.name).sort(), [...model.stateDict().keys()].sort());
    let underflowing = 0;
    for (const [name, p] of model.namedParameters()) {
      const row = report.params.find((r) => r.name === name)!;
      assert.deepEqual(countsOf(row), cpuCounts(await p.grad!.read()), name);
      assert.equal(row.underflowFraction, row.underflowF16 / row.values);
      underflowing += row.underflowF16;
    }
    assert.ok(underflowing > 0, "the test sees some underflow");
    model.dispose();
    inspector.dispose();
    x.dispose();
  },
});

Deno.test({
  name:
    "NumericsInspector: report({ reset: true }) starts counting afresh; steps keep their numbers",
  ...GPU_TEST,
  async fn() {
    const model = mlp(8);
    const inspector = new NumericsInspector(model);
    const x = batch();
    const step = () => crossEntropy(model.forward(x), LABELS).backward();
    inspector.watch(step);
    inspector.watch(step);
    const first = await inspector.report({ reset: true });
    assert.equal(first.steps, 2);
    const empty = await inspector.report();
    assert.equal(empty.steps, 0);
    assert.deepEqual(
      empty.rows.map((r) => [r.calls, r.values, r.zeros, r.amax]),
      empty.rows.map(() => [0, 0, 0, 0]),
    );
    assert.deepEqual(empty.ops, []);
    model.zeroGrad();
    await plant(model.stateDict().get("4.bias")!, 0, NaN);
    inspector.watch(step); // step 2
    const after = await inspector.report();
    assert.equal(after.steps, 1);
    assert.equal(after.rows.find((r) => r.name === "0" && r.phase === "forward")?.calls, 1);
    assert.deepEqual(
      [after.firstNonFinite?.step, after.firstNonFinite?.name, after.firstNonFinite?.phase],
      [2, "4", "forward"],
    );
    model.dispose();
    inspector.dispose();
    x.dispose();
  },
});

const ampTest = { ignore: !gpu.f16, ...GPU_TEST };
const noF16 = gpu.f16 ? "" : " (ignored: no shader-f16)";

Deno.test({
  name: `NumericsInspector under AmpTrainer: a layer whose f16 output overflows is named, ` +
    `the step skipped${noF16}`,
  ...ampTest,
  async fn() {
    const model = mlp(2);
    const optimizer = new SGD(model.parameters(), { lr: 0.1 });
    const inspector = new NumericsInspector(model);
    // Weights of 300 and inputs of 100: layer "0" gives |y| ~ 1e5 > 65504 in f16.
    const w = model.stateDict().get("0.weight")!;
    w.writeBytes(new Uint8Array(new Float32Array(w.size).fill(300).buffer));
    const trainer = new AmpTrainer(model, optimizer, { inspector });
    const x = Tensor.from(new Float32Array(LABELS.length * FEATURES).fill(100), [
      LABELS.length,
      FEATURES,
    ]);
    const before = await model.stateDict().get("2.weight")!.read();
    const reads = gpu.batch.counters.reads;
    trainer.step(() => crossEntropy(model.forward(x), LABELS)).dispose();
    assert.equal(gpu.batch.counters.reads, reads, "an attached step reads nothing back");
    assert.equal(await trainer.scaler.lastStepSkipped(), true);
    assert.deepEqual(await model.stateDict().get("2.weight")!.read(), before);
    const report = await inspector.report();
    assert.deepEqual(report.firstNonFinite, {
      step: 0,
      name: "0",
      op: "linear",
      phase: "forward",
      call: 0,
      scale: 2 ** 16,
    });
    const cast = report.rows.find((r) => r.name === "0" && r.op === "cast");
    assert.equal(cast?.dtype, "f16", "the working copy is counted, and is finite");
    assert.equal(cast?.nonFinite, 0);
    assert.equal(report.lossScale, 2 ** 15, "the scale backed off after the step");
    assert.deepEqual(report.ops.find((o) => o.op === "linear")?.calls, { f16: 3 });
    trainer.dispose();
    inspector.dispose();
    x.dispose();
  },
});

Deno.test({
  name:
    `NumericsInspector under AmpTrainer: an overflow only in backward names a backward op${noF16}`,
  ...ampTest,
  async fn() {
    const model = mlp(3);
    const optimizer = new SGD(model.parameters(), { lr: 0.1 });
    const inspector = new NumericsInspector(model);
    let trainer!: AmpTrainer; // 2^24 is meant to overflow: its warning is expected
    await capturedWarnings(() => {
      trainer = new AmpTrainer(model, optimizer, { inspector, lossScale: 2 ** 24 });
    });
    const x = batch();
    trainer.step(() => crossEntropy(model.forward(x), LABELS)).dispose();
    assert.equal(await trainer.scaler.lastStepSkipped(), true);
    const report = await inspector.report();
    const first = report.firstNonFinite!;
    assert.equal(first.phase, "backward");
    assert.equal(first.scale, 2 ** 24);
    assert.deepEqual(report.rows.filter((r) => r.phase === "forward" && r.nonFinite > 0), []);
    const culprit = report.rows.find((r) =>
      r.name === first.name && r.op === first.op && r.phase === "backward" && r.nonFinite > 0
    );
    assert.ok(culprit, `the named row ${first.name}/${first.op} holds the non-finite values`);
    // Everything that ran before it in backward (the loss's own gradients) was finite.
    const order = report.rows.filter((r) => r.phase === "backward");
    const earlier = order.slice(0, order.indexOf(culprit));
    assert.deepEqual(earlier.filter((r) => r.nonFinite > 0), []);
    trainer.dispose();
    inspector.dispose();
    x.dispose();
  },
});

Deno.test({
  name: "NumericsInspector: detached it changes nothing (dispatches, bits); attached, only " +
    "its own kernels are added and results stay bit-identical",
  ...GPU_TEST,
  async fn() {
    const plain = mlp(4), watched = mlp(4);
    const inspector = new NumericsInspector(watched);
    const x = batch();
    const step = (model: Sequential) => {
      const before = gpu.batch.counters.dispatches;
      crossEntropy(model.forward(x), LABELS).backward();
      return gpu.batch.counters.dispatches - before;
    };
    const grads = async (model: Sequential) => {
      const out = [];
      for (const p of model.parameters()) out.push([...await p.grad!.read()]);
      model.zeroGrad();
      return out;
    };
    const base = step(plain);
    const attached = inspector.watch(() => step(watched));
    assert.deepEqual(await grads(watched), await grads(plain), "same bits while attached");
    const report = await inspector.report();
    const counted = report.rows.reduce((n, r) => n + r.calls, 0);
    assert.equal(attached, base + counted, "one statistics kernel per counted tensor");
    assert.equal(step(watched), base, "detached: the same dispatches");
    assert.deepEqual(await grads(watched), await grads((step(plain), plain)));
    assert.deepEqual(wrapped(watched), [], "forward methods unwrapped after watch");
    plain.dispose();
    watched.dispose();
    inspector.dispose();
    x.dispose();
  },
});

Deno.test({
  name: "NumericsInspector: misuse is refused (nested watch, async fn, after dispose) and " +
    "a throwing step still unwraps forward",
  ...GPU_TEST,
  async fn() {
    const model = mlp(5);
    const inspector = new NumericsInspector(model);
    assert.throws(
      () => inspector.watch(() => inspector.watch(() => 0)),
      (e) => e instanceof StateError && /another watch is running/.test(e.message),
    );
    assert.throws(() => inspector.watch(() => Promise.resolve(1)), ValueError);
    assert.throws(() =>
      inspector.watch(() => {
        throw new Error("boom");
      }), /boom/);
    assert.deepEqual(wrapped(model), []);
    assert.throws(() => new NumericsInspector({} as Sequential), ValueError);
    const other = mlp(6);
    assert.throws(
      () => new AmpTrainer(other, new SGD(other.parameters(), { lr: 1 }), { inspector }),
      (e) => e instanceof ValueError && /inspector watches another model/.test(e.message),
    );
    other.dispose();
    const empty = await new NumericsInspector(model).report();
    assert.deepEqual(empty, {
      steps: 0,
      rows: [],
      firstNonFinite: null,
      ops: [],
      params: [],
      lossScale: null,
    });
    inspector.dispose();
    assert.throws(() => inspector.watch(() => 0), StateError);
    await assert.rejects(() => inspector.report(), StateError);
    model.dispose();
  },
});

Deno.test({
  name: "NumericsInspector: a checkpointed region is counted once and its gradients keep " +
    "their layers' names",
  ...GPU_TEST,
  async fn() {
    const x = batch();
    const run = (checkpointed: boolean) => {
      const model = mlp(6);
      const inspector = new NumericsInspector(model);
      const forward = (h: Tensor) => model.forward(h);
      inspector.watch(() =>
        crossEntropy(checkpointed ? checkpoint(forward, x) : forward(x), LABELS).backward()
      );
      return { model, inspector };
    };
    const plain = run(false), recomputed = run(true);
    const shown = async (r: { inspector: NumericsInspector }) =>
      (await r.inspector.report()).rows
        .filter((row) => row.op !== "checkpoint")
        .map(({ name, op, phase, calls, values }) => ({ name, op, phase, calls, values }));
    assert.deepEqual(await shown(recomputed), await shown(plain));
    for (const r of [plain, recomputed]) {
      r.model.dispose();
      r.inspector.dispose();
    }
    x.dispose();
  },
});

Deno.test({
  name: "NumericsInspector: over steps that break at different points the first report names " +
    "the earliest in time (a late layer in step 1, not an earlier layer in step 2); after a " +
    "reset, the next report names its own first",
  ...GPU_TEST,
  async fn() {
    const model = mlp(3);
    const inspector = new NumericsInspector(model);
    const x = batch();
    const step = () => crossEntropy(model.forward(x), LABELS).backward();
    inspector.watch(step); // step 0: clean
    model.zeroGrad();
    await plant(model.stateDict().get("4.weight")!, 3, Infinity);
    inspector.watch(step); // step 1: the last layer breaks
    model.zeroGrad();
    await plant(model.stateDict().get("0.weight")!, 2, -Infinity);
    inspector.watch(step); // step 2: the first layer breaks, earlier in the step
    model.zeroGrad();
    const first = await inspector.report({ reset: true });
    assert.deepEqual(
      { step: first.firstNonFinite?.step, name: first.firstNonFinite?.name },
      { step: 1, name: "4" },
    );
    assert.equal(first.firstNonFinite?.phase, "forward");
    inspector.watch(step); // step 3: still broken at the first layer
    const second = await inspector.report();
    assert.equal(second.steps, 1);
    assert.deepEqual(
      { step: second.firstNonFinite?.step, name: second.firstNonFinite?.name },
      { step: 3, name: "0" },
    );
    model.dispose();
    inspector.dispose();
    x.dispose();
  },
});
