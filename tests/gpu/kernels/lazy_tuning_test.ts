/**
 * Lazy tuning (issue 39): `initGpu()` used to tune every matmul class and
 * attention dtype before it returned — 40 s to 2 min on the CPU adapter,
 * even for a 2→32→2 XOR model. Now a kernel is tuned the first time its
 * shape runs, at the next wait, once, within a budget; products too small
 * for the tiling to matter are never tuned. Timings are injected (a timer
 * that counts calls and moves a fake clock), so these tests count
 * measurements instead of timing anything, and leave the per-user cache
 * alone (a memory store stands in for it).
 */
import assert from "node:assert/strict";
import {
  AdamW,
  AmpTrainer,
  crossEntropy,
  fusedCausalAttention,
  Linear,
  matmul,
  ReLU,
  Sequential,
  Tensor,
} from "../../../mod.ts";
import {
  attentionSettings,
  initGpu,
  LAZY_MIN_WORK,
  lazyTuning,
  matmulCandidates,
  matmulSettings,
  pendingTuning,
  tilingFor,
  tunePending,
} from "../../../gpu/mod.ts";
import { shapeState } from "../../../gpu/kernels/gemm/shape_picks.ts";
import { denseProblem } from "../../../gpu/kernels/gemm/matmul_class.ts";
import { matmul64 } from "../../helpers/reference.ts";
import { asGpu, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { withLazyTuning, withRealLazyTuning } from "../../helpers/lazy_tuning.ts";

/** The values of an m × k (or k × m) operand: fixed, in [-0.5, 0.5). */
function values(count: number, step: number, period: number): number[] {
  return Array.from({ length: count }, (_, i) => ((i * step) % period) / period - 0.5);
}

/** A recorded (not waited for) f32 product of m × k by k × n, operands stored as `orientation` reads them. */
function product(m: number, k: number, n: number, orientation = "nn"): Tensor {
  const transA = orientation === "tn", transB = orientation === "nt";
  const a = Tensor.from(values(m * k, 7, 11), transA ? [k, m] : [m, k]);
  const b = Tensor.from(values(k * n, 5, 13), transB ? [n, k] : [k, n]);
  const c = matmul(a, b, { transA, transB });
  a.dispose();
  b.dispose();
  return c;
}

Deno.test({
  name:
    "lazy tuning: the README's XOR model trains 300 steps, reading its loss, and measures nothing",
  ...GPU_TEST,
  async fn() {
    await withLazyTuning({}, async (lazy) => {
      const model = new Sequential(
        new Linear(2, 32, { seed: 1 }),
        new ReLU(),
        new Linear(32, 2, { seed: 2 }),
      );
      const trainer = new AmpTrainer(model, new AdamW(model.parameters(), { lr: 1e-2 }));
      const x = Tensor.from([0, 0, 0, 1, 1, 0, 1, 1], [4, 2]);
      let loss = Infinity;
      for (let step = 1; step <= 300; step++) {
        const l = trainer.step(() => crossEntropy(model.forward(x), [0, 1, 1, 0]));
        if (step % 100 === 0) loss = await l.item(); // a wait: lazy tuning's chance
        l.dispose();
      }
      assert.ok(loss < 0.05, `XOR learnt: loss ${loss}`);
      // Its products (4×2 by 2×32 and back) are far below the size where a tiling matters.
      assert.ok(4 * 32 * 2 < LAZY_MIN_WORK);
      assert.deepEqual(lazy.timings, [], "no candidate was timed");
      assert.deepEqual(pendingTuning(gpu), [], "nothing is left to tune either");
      assert.deepEqual(lazy.progress, [], "and nothing was said");
      x.dispose();
      for (const p of model.parameters()) p.dispose();
    });
  },
});

Deno.test({
  name: "lazy tuning: a product's class is tuned at the first wait after it runs, once; " +
    "what was recorded before keeps the default and reads right",
  ...GPU_TEST,
  async fn() {
    const fastest = JSON.stringify(matmulCandidates(gpu, "f32")[2]);
    await withLazyTuning({ fastest }, async (lazy) => {
      const [m, k, n] = [96, 128, 80]; // 983040 multiply-adds: worth tuning
      const { classTilings, tiling } = matmulSettings.of(gpu);
      const problem = denseProblem({ batch: 1, m, n, k }, "nn");
      assert.equal(tilingFor(gpu, problem, "f32"), tiling, "untuned: the default tiling");
      const c = product(m, k, n);
      // On a CPU adapter the medium class's winner serves every size: that class is noted.
      const key = gpu.adapterProfile.cpu ? "f32/nn/medium" : "f32/nn/small";
      assert.deepEqual(pendingTuning(gpu).map((p) => `${p.task} ${p.key}`), [
        `matmul tilings ${key}`,
      ]);
      assert.deepEqual(lazy.timings, [], "recording a step never tunes");
      const read = await c.read(); // the wait
      const candidates = matmulCandidates(gpu, "f32").length;
      assert.equal(lazy.timings.length, candidates + 3, "every candidate, then three finalists");
      assert.equal(JSON.stringify(classTilings.get(key)), fastest, "the pick is the fastest");
      assert.equal(
        JSON.stringify(tilingFor(gpu, problem, "f32")),
        fastest,
        "later products run it",
      );
      assert.deepEqual(lazy.progress, ["matmul tilings 0/1", "matmul tilings 1/1"]);
      // The product recorded before the wait ran as recorded, and right.
      const expected = matmul64(values(m * k, 7, 11), values(k * n, 5, 13), {
        batch: 1,
        m,
        n,
        k,
        transA: false,
        transB: false,
      });
      // f32 sums of 128 products of values under 0.5 in size: within 1e-5 of f64.
      assert.ok(read.every((v, i) => Math.abs(v - expected[i]) <= 1e-5), "c = a·b");
      c.dispose();
      // The same class again, and another wait: nothing is measured twice.
      product(m, k, n).dispose();
      product(2 * m, k, n).dispose();
      await gpu.sync();
      assert.equal(lazy.timings.length, candidates + 3, "tuned once");
      assert.deepEqual(pendingTuning(gpu), []);
    });
  },
});

Deno.test({
  name: "lazy tuning: each wait starts no job after its budget, none after the total; " +
    "tunePending ignores both",
  ...GPU_TEST,
  async fn() {
    // A class takes 13 timings of 0.3 s (3.9 s): one a wait under 2 s, three within 10 s.
    const budget = { perWaitSeconds: 2, totalSeconds: 10 };
    await withLazyTuning({ secondsPerTiming: 0.3, budget }, async (lazy) => {
      const perClass = matmulCandidates(gpu, "f32").length + 3;
      // Three orientations of one f32 product: three classes.
      for (const orientation of ["nn", "nt", "tn"]) product(128, 64, 64, orientation).dispose();
      assert.equal(pendingTuning(gpu).length, 3);
      const counts: number[] = [];
      for (let wait = 0; wait < 4; wait++) {
        await gpu.sync();
        counts.push(lazy.timings.length / perClass);
      }
      // 3.9 s, 7.8 s, then a third job starts at 7.8 < 10 s (11.7 s), and no fourth.
      assert.deepEqual(counts, [1, 2, 3, 3]);
      assert.ok(Math.abs(lazy.timings.length * 0.3 - lazyTuning.of(gpu).spentSeconds) < 1e-9);
      // Past the total, a new class waits for an explicit tunePending.
      const bf = Tensor.full([128, 64], 0.5, { dtype: "bf16" });
      const bw = Tensor.full([64, 64], 0.25, { dtype: "bf16" });
      matmul(bf, bw).dispose();
      const one = Tensor.full([1], 1);
      await one.item(); // a read is a wait too
      await gpu.sync();
      one.dispose();
      assert.equal(lazy.timings.length, 3 * perClass, "the total is spent: nothing at a wait");
      assert.equal(pendingTuning(gpu).length, 1);
      assert.equal(await tunePending(gpu), 1, "tunePending tunes it all the same");
      assert.equal(lazy.timings.length, 4 * perClass);
      for (const t of [bf, bw]) t.dispose();
    });
  },
});

Deno.test({
  name: "lazy tuning: nothing tunes inside gpu.profile (its figures are the caller's); " +
    "the next wait does",
  ...GPU_TEST,
  async fn() {
    await withLazyTuning({}, async (lazy) => {
      const report = await gpu.profile(async () => {
        product(128, 64, 64).dispose();
        await gpu.sync();
      }, { print: false });
      assert.deepEqual(report.rows.map((r) => r.kernel).filter((k) => k === "matmul"), ["matmul"]);
      assert.deepEqual(lazy.timings, []);
      assert.equal(pendingTuning(gpu).length, 1);
      await gpu.sync();
      assert.ok(lazy.timings.length > 0);
      assert.deepEqual(pendingTuning(gpu), []);
    });
  },
});

Deno.test({
  name: "lazy tuning on GPUs: classes and dtypes first, then each product and attention at " +
    "its own shape, at one wait",
  ...GPU_TEST,
  async fn() {
    await withLazyTuning({}, async (lazy) => {
      const q = Tensor.full([1, 64, 64], 0.1); // B = 1, T = 64, C = 64: two heads of 32
      fusedCausalAttention(q, q, q, { heads: 2 }).dispose(); // 1·2·64²·32 = 2^18: just worth it
      product(128, 64, 96).dispose();
      assert.deepEqual(pendingTuning(gpu).map((p) => p.task), [
        "matmul tilings",
        "attention plans",
        "matmul shapes",
        "attention shapes",
      ]);
      await gpu.sync();
      assert.deepEqual(pendingTuning(gpu), []);
      assert.ok(matmulSettings.of(gpu).classTilings.has("f32/nn/small"));
      assert.ok(attentionSettings.of(gpu).plans.has("f32"));
      assert.deepEqual([...shapeState(gpu).picks.keys()], ["f32>f32/nn/b1/128x96x64/none/none"]);
      assert.deepEqual([...attentionSettings.of(gpu).shapes.picks.keys()], ["f32/bh2/t64/d32"]);
      assert.deepEqual(
        lazy.progress.filter((p) => p.includes(" 0/")),
        ["matmul tilings 0/4"],
        "one report opens the wait",
      );
      q.dispose();
    }, asGpu);
  },
});

Deno.test({
  name: "initGpu's tuning option: lazy, eager or off, checked before any adapter; " +
    "a fixed tiling turns tuning off, and a mode beside it is refused",
  ...GPU_TEST,
  async fn() {
    await assert.rejects(
      initGpu({ tuning: "sometimes" as "lazy" }),
      /^ValueError: initGpu: tuning must be "lazy", "eager" or "off", not "sometimes"/,
    );
    await assert.rejects(
      initGpu({ tuning: "eager", matmulTiling: "default" }),
      /^ValueError: initGpu: tuning "eager" tunes the matmul tilings, which matmulTiling "default" fixes/,
    );
    for (const options of [{ tuning: "off" }, { matmulTiling: "default" }] as const) {
      const other = await initGpu({ ...options, setDefault: false });
      assert.equal(lazyTuning.of(other).mode, "off", JSON.stringify(options));
      const a = Tensor.full([128, 128], 1, { gpu: other });
      matmul(a, a).dispose(); // 2^21 multiply-adds: noted, were tuning lazy
      await other.sync();
      assert.deepEqual(pendingTuning(other), [], "nothing noted");
      other.destroy();
    }
  },
});

Deno.test({
  name:
    "lazy tuning without a progress callback, timed on the GPU: tunePending counts the keys it " +
    "tuned, and the tuners' scratch buffers leave the pool and the caller's peak",
  ...GPU_TEST,
  async fn() {
    await withRealLazyTuning(async () => {
      const c = product(96, 128, 80); // worth tuning: its class is noted
      assert.equal((await c.read()).length, 96 * 80);
      c.dispose();
      assert.equal(pendingTuning(gpu).length, 1, "noted at the wait, not tuned there");
      const before = gpu.memoryStats();
      // It used to count inside lazy.onProgress?.(...): without a callback, 0 keys, and the
      // scratch buffers the tuner timed with stayed in the pool and in the caller's peak.
      assert.equal(await tunePending(gpu), 1, "one class tuned");
      const after = gpu.memoryStats();
      assert.deepEqual(pendingTuning(gpu), []);
      assert.equal(after.peakBytes, before.peakBytes, "the caller's peak, not the tuner's");
      assert.equal(after.allocatedBytes, before.allocatedBytes, "nothing left allocated");
      assert.equal(after.reservedBytes, after.allocatedBytes, "no scratch buffer left cached");
    });
  },
});
