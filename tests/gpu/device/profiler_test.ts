/**
 * gpu.profile(fn): every dispatch the function records is counted once, under
 * its kernel family and config, with a GPU time; the table lists every family
 * that ran; both timing modes work; misuse is a clear error.
 */
import assert from "node:assert/strict";
import {
  AdamW,
  AmpTrainer,
  crossEntropy,
  LayerNorm,
  Linear,
  RandomGenerator,
  Sequential,
  StateError,
  Tensor,
  tidy,
} from "../../../mod.ts";
import { dispatchedKernels, gpu, GPU_TEST } from "../../helpers/gpu.ts";

/** A small AMP model step: matmuls, LayerNorm, cross-entropy, the scaler and fused AdamW. */
function setup() {
  const rng = new RandomGenerator(1);
  const model = new Sequential(
    new Linear(12, 24, { seed: rng, activation: "relu" }),
    new LayerNorm(24),
    new Linear(24, 5, { seed: rng }),
  );
  const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
  const trainer = new AmpTrainer(model, optimizer, { maxGradNorm: 1 });
  const x = Tensor.from(rng.uniform(8 * 12, -1, 1), [8, 12]);
  const labels = [0, 1, 2, 3, 4, 0, 1, 2];
  const step = () => trainer.step(() => crossEntropy(model.forward(x), labels)).dispose();
  const dispose = () => {
    trainer.dispose();
    optimizer.dispose();
    model.dispose();
    x.dispose();
  };
  return { step, dispose };
}

/** The family of each dispatch `fn` records, from the command batch itself. */
function familiesOf(fn: () => void): Map<string, number> {
  const families = new Map<string, number>();
  for (const key of dispatchedKernels(fn)) {
    const family = key.slice(0, key.indexOf("{"));
    families.set(family, (families.get(family) ?? 0) + 1);
  }
  return families;
}

Deno.test({
  name: "profiler: every kernel family that ran appears, with counts that match the batch counters",
  ...GPU_TEST,
  async fn() {
    const { step, dispose } = setup();
    step(); // compile the pipelines first
    const expected = familiesOf(() => step());
    const before = gpu.batch.counters.dispatches;
    const report = await gpu.profile(() => {
      step();
      step();
    }, { print: false });
    const dispatched = gpu.batch.counters.dispatches - before;
    assert.equal(report.dispatches, dispatched, "one record per dispatch");
    assert.equal(report.rows.reduce((n, r) => n + r.calls, 0), dispatched);
    const byFamily = new Map<string, number>();
    for (const r of report.rows) byFamily.set(r.kernel, (byFamily.get(r.kernel) ?? 0) + r.calls);
    assert.deepEqual(
      new Map([...byFamily].sort()),
      new Map([...expected].map(([k, n]) => [k, 2 * n] as [string, number]).sort()),
      "the same families and counts as the batch recorded",
    );
    for (const family of ["matmul", "layer_norm_forward", "cross_entropy_forward", "fused_adam"]) {
      assert.ok(byFamily.has(family), `${family} is in the profile`);
    }
    assert.equal(report.timing, gpu.device.features.has("timestamp-query") ? "timestamp" : "wall");
    assert.ok(report.rows.every((r) => r.totalMs >= 0 && r.calls > 0));
    for (let i = 1; i < report.rows.length; i++) {
      assert.ok(report.rows[i - 1].totalMs >= report.rows[i].totalMs, "sorted by GPU time");
    }
    const shares = report.rows.reduce((s, r) => s + r.share, 0);
    assert.ok(report.gpuMs === 0 || Math.abs(shares - 1) < 1e-9, `shares sum to 1 (${shares})`);
    const matmul = report.rows.find((r) => r.kernel === "matmul")!;
    assert.ok(matmul.flops! > 0 && matmul.bytes! > 0, "matmuls report FLOPs and bytes");
    const table = report.table();
    for (const family of byFamily.keys()) assert.ok(table.includes(family), family);
    assert.match(table.split("\n")[1], /kernel\s+calls\s+total ms\s+mean ms\s+share/);
    dispose();
  },
});

Deno.test({
  name: "profiler: wall-time mode, a failing function, and nesting",
  ...GPU_TEST,
  async fn() {
    const { step, dispose } = setup();
    step();
    const report = await gpu.profile(() => step(), { timing: "wall", print: false });
    assert.equal(report.timing, "wall");
    assert.ok(report.dispatches > 0 && report.gpuMs >= 0);
    assert.match(report.table(), /wall time per submit, split evenly/);
    // A throwing function: the error comes through, the profiler detaches, the device works.
    await assert.rejects(
      gpu.profile(() => {
        step();
        throw new Error("boom");
      }, { print: false }),
      /boom/,
    );
    assert.equal(gpu.batch.profiler, null);
    const nested = gpu.profile(async () => {
      await assert.rejects(gpu.profile(() => {}), StateError);
    }, { print: false });
    await nested;
    const y = tidy(() => Tensor.from([1, 2], [2]));
    assert.deepEqual(Array.from(await y.read()), [1, 2]);
    y.dispose();
    dispose();
  },
});
