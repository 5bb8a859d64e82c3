/**
 * Mixed precision in bf16 (issue 30): autocast's low-precision list runs in
 * bf16, fp32 masters write bf16 working copies (each the master rounded to
 * nearest-even, checked against a rounding computed here), the GradScaler is
 * off by default (a scale of 1, nothing skipped) but may be asked for, it
 * works on a device without shader-f16, a run saved mid-accumulation resumes
 * bit for bit, and a bf16 step's peak memory matches an f16 step's.
 */
import assert from "node:assert/strict";
import {
  AdamW,
  AmpTrainer,
  type AmpTrainerOptions,
  autocast,
  compareToF32,
  crossEntropy,
  DTypeError,
  initGpu,
  Linear,
  linear,
  MasterWeights,
  matmul,
  RandomGenerator,
  ReLU,
  Sequential,
  SGD,
  softmax,
  sum,
  Tensor,
  tidy,
} from "../../mod.ts";
import { Gpt } from "../../models/mod.ts";
import { add } from "../../gpu/mod.ts";
import { loadTrainingState, saveTrainingState } from "../../files.ts";
import { clipGradNorm } from "../../optim/mod.ts";
import { runtime } from "../../gpu/mod.ts";
import { gpu as sharedGpu, GPU_TEST } from "../helpers/gpu.ts";
import { matmul64, quantize, uniform } from "../helpers/reference.ts";
import { assertClose, TOL } from "../helpers/assert.ts";
import { capturedWarnings } from "../helpers/warnings.ts";
import {
  ampRun,
  batch,
  CLASSES,
  FEATURES,
  type Run,
  snapshot,
  train,
} from "../helpers/training_state.ts";
import type { Gpu } from "../../gpu/mod.ts";

/** Each value rounded to bf16 from its f32, ties to even, on the bits (not the library's code). */
function bf16Bits(values: ArrayLike<number>): Float32Array {
  const f = Float32Array.from(values);
  const u = new Uint32Array(f.buffer);
  for (let i = 0; i < u.length; i++) {
    const low = u[i] & 0xffff, odd = (u[i] >>> 16) & 1;
    u[i] = ((u[i] >>> 16) + (low > 0x8000 || (low === 0x8000 && odd === 1) ? 1 : 0)) << 16;
  }
  return f;
}

/** Every working copy of `masters` equals its master rounded to bf16, bit for bit. */
async function assertCopiesRounded(masters: MasterWeights, what: string): Promise<void> {
  for (const m of masters.masters) {
    const copy = masters.copyOf(m)!;
    assert.equal(copy.dtype, "bf16", what);
    assert.deepStrictEqual(await copy.read(), bf16Bits(await m.read()), `${what}: copy of ${m}`);
  }
}

function mlp(seed: number, gpu?: Gpu): Sequential {
  const rng = new RandomGenerator(seed);
  return new Sequential(
    new Linear(FEATURES, 17, { seed: rng, gpu }),
    new ReLU(),
    new Linear(17, CLASSES, { seed: rng, gpu }),
  );
}

/** `steps` steps of a fresh MLP's trainer on the shared batches; its weights and last loss. */
async function trainMlp(options: AmpTrainerOptions, steps: number, gpu?: Gpu) {
  const model = mlp(3, gpu);
  const optimizer = new AdamW(model.parameters(), { lr: 1e-2 });
  const trainer = new AmpTrainer(model, optimizer, options);
  const losses: number[] = [];
  for (let i = 0; i < steps; i++) {
    const b = batch(i % 10, 16);
    const x = Tensor.from(b.x, [16, FEATURES], { gpu });
    const loss = trainer.step(() => crossEntropy(model.forward(x), b.labels));
    losses.push(await loss.item());
    loss.dispose();
    x.dispose();
  }
  if (trainer.masters) await assertCopiesRounded(trainer.masters, "after training");
  const weights = await Promise.all(model.parameters().map((p) => p.read()));
  const scaler = {
    enabled: trainer.scaler.enabled,
    scale: await trainer.scaler.getScale(),
    skipped: await trainer.scaler.skippedSteps(),
  };
  const copies = trainer.masters?.dtype;
  trainer.dispose();
  optimizer.dispose();
  model.dispose();
  return { losses, weights, scaler, copies };
}

Deno.test({
  name: "autocast bf16: matmul and linear run in bf16, softmax and sums in f32, mixed promote; " +
    "the product equals f64 of bf16-rounded inputs",
  ...GPU_TEST,
  async fn() {
    const [m, n, k] = [7, 5, 13]; // odd sizes: two threads write the halves of one word
    const x = Tensor.from(uniform(m * k, 1), [m, k]);
    const w = Tensor.from(uniform(n * k, 2), [n, k]);
    const bf16 = { dtype: "bf16" } as const;
    tidy(() => {
      autocast(() => {
        const h = matmul(x, w, { transB: true });
        assert.equal(h.dtype, "bf16");
        assert.equal(linear(x, w).dtype, "bf16");
        assert.equal(softmax(h).dtype, "f32", "softmax is on the f32 list");
        assert.equal(sum(h).dtype, "f32", "sums are on the f32 list");
        assert.equal(add(h, Tensor.zeros([n])).dtype, "f32", "bf16 + f32 promotes to f32");
        assert.equal(add(h, h).dtype, "bf16");
        const f16 = Tensor.zeros([m, n], { dtype: sharedGpu.f16 ? "f16" : "f32" });
        assert.equal(add(h, f16).dtype, "f32", "bf16 + f16 promotes to f32, as in PyTorch");
      }, bf16);
    });
    const y = tidy(() => autocast(() => linear(x, w), bf16));
    const ref = matmul64(quantize(uniform(m * k, 1), "bf16"), quantize(uniform(n * k, 2), "bf16"), {
      batch: 1,
      m,
      n,
      k,
      transA: false,
      transB: true,
    });
    assertClose(await y.read(), quantize(ref, "bf16"), TOL.bf16, "autocast bf16 linear");
    for (const t of [x, w, y]) t.dispose();
  },
});

Deno.test({
  name: "MasterWeights bf16: copies are the masters rounded to nearest-even; bf16 ops read them " +
    "and gradients land, in f32, in the masters",
  ...GPU_TEST,
  async fn() {
    // Values whose low 16 bits are exact ties (even and odd kept parts), above and below them.
    const ties = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8) * 2 ** 100, 1 + 2 ** -8 + 2 ** -20];
    const wv = [...ties, ...uniform(3 * 5 - ties.length, 3)];
    const w = Tensor.from(wv, [3, 5], { requiresGrad: true });
    const masters = new MasterWeights([w], { dtype: "bf16" });
    assert.equal(masters.dtype, "bf16");
    await assertCopiesRounded(masters, "initial copy");
    assert.deepEqual(
      [...(await masters.copyOf(w)!.read()).slice(0, 4)],
      [1, 1 + 4 * 2 ** -8, -(2 ** 100), 1 + 2 * 2 ** -8],
      "ties to even, and above a tie up",
    );
    // Prove the op reads the copy: make it differ from the master.
    masters.copyOf(w)!.copyFrom(Tensor.full([3, 5], 1, { dtype: "bf16" }));
    const xv = uniform(2 * 5, 4);
    const x = Tensor.from(xv, [2, 5]);
    const y = tidy(() => autocast(() => linear(x, w), { masterWeights: masters, dtype: "bf16" }));
    const xs = quantize(xv, "bf16");
    const rowSums = [0, 1].map((r) => xs.slice(r * 5, r * 5 + 5).reduce((a, b) => a + b, 0));
    assertClose(await y.read(), rowSums.flatMap((s) => [s, s, s]), TOL.bf16, "read from the copy");
    // An f16 autocast does not take a bf16 copy for its own.
    const z = tidy(() => autocast(() => linear(x, w), { masterWeights: masters }));
    assert.notEqual(z.dtype, "bf16");
    for (let micro = 0; micro < 2; micro++) {
      tidy(() =>
        autocast(() => sum(linear(x, w)), { masterWeights: masters, dtype: "bf16" }).backward()
      );
    }
    assert.equal(w.grad!.dtype, "f32");
    const dw = [0, 1, 2].flatMap(() => [0, 1, 2, 3, 4].map((i) => 2 * (xs[i] + xs[5 + i])));
    assertClose(await w.grad!.read(), dw, TOL.bf16, "accumulated master gradient");
    masters.refresh();
    await assertCopiesRounded(masters, "refreshed copy");
    masters.dispose();
    for (const t of [w, x, y, z]) t.dispose();
  },
});

Deno.test({
  name: "a dtype other than f16 or bf16 is a DTypeError listing both, and changes nothing",
  ...GPU_TEST,
  fn() {
    const w = Tensor.from([1, 2], [1, 2], { requiresGrad: true });
    const choices =
      /DTypeError|dtype "bfloat16" is not an autocast dtype; use one of "f16", "bf16"/;
    const bad = { dtype: "bfloat16" } as unknown as { dtype: "bf16" };
    for (
      const [where, make] of [
        ["autocast", () => autocast(() => linear(w, w), bad)],
        ["MasterWeights", () => new MasterWeights([w], bad)],
        ["AmpTrainer", () => new AmpTrainer(mlp(1), new SGD([w], { lr: 1 }), bad)],
      ] as const
    ) {
      assert.throws(make, (e) => e instanceof DTypeError && choices.test(e.message), where);
      assert.throws(make, new RegExp(`^DTypeError|^${where}: dtype`), where);
    }
    assert.equal(runtime.castHook, null, "no hook left installed");
    assert.throws(
      () => autocast(() => 0, { dtype: "x".repeat(1000) as "bf16" }),
      (e) => e instanceof Error && e.message.length < 200,
      "a long value is cut",
    );
    w.dispose();
  },
});

Deno.test({
  name: "clipGradNorm on bf16 gradients of odd sizes: the norm and the clipped values match f64",
  ...GPU_TEST,
  async fn() {
    const values = [uniform(7, 1, -3, 3), uniform(1031, 2, -3, 3), uniform(1, 3, -3, 3)];
    const q = values.map((v) => quantize(v, "bf16"));
    const params = q.map((v) => {
      const p = Tensor.zeros([v.length], { requiresGrad: true });
      p.grad = Tensor.from(v, [v.length], { dtype: "bf16" });
      return p;
    });
    const norm = Math.sqrt(q.reduce((s, v) => s + v.reduce((a, b) => a + b * b, 0), 0));
    const { totalNorm, coefficient } = clipGradNorm(params, 1.5);
    assertClose(await totalNorm.read(), [norm], TOL.f32, "norm");
    const coef = (await coefficient.read())[0];
    assertClose([coef], [1.5 / (norm + 1e-6)], TOL.f32, "coefficient");
    for (const [i, p] of params.entries()) {
      const want = bf16Bits(q[i].map((v) => Math.fround(v * coef)));
      assert.deepStrictEqual(await p.grad!.read(), want, `clipped ${i}`);
    }
    for (const t of [...params, totalNorm, coefficient]) t.grad?.dispose(), t.dispose();
  },
});

Deno.test({
  name: "AmpTrainer bf16: bf16 working copies, no loss scaling by default (scale 1, nothing " +
    "skipped), trains like f32; a scaler asked for gives the same bits at a power-of-two scale",
  ...GPU_TEST,
  async fn() {
    const steps = 40;
    const f32 = await trainMlp({ enabled: false }, steps);
    const bf16 = await trainMlp({ dtype: "bf16" }, steps);
    assert.equal(bf16.copies, "bf16");
    assert.deepEqual(bf16.scaler, { enabled: false, scale: 1, skipped: 0 });
    const mean = (l: number[]) => l.slice(-10).reduce((a, b) => a + b, 0) / 10;
    assert.ok(mean(bf16.losses) < 0.7 * bf16.losses[0], `bf16 trains: ${bf16.losses}`);
    assert.ok(Math.abs(mean(bf16.losses) - mean(f32.losses)) < 0.05, "bf16 ≈ f32");
    const scaled = await trainMlp({ dtype: "bf16", scaler: { enabled: true } }, steps);
    assert.deepEqual(scaled.scaler, { enabled: true, scale: 2 ** 16, skipped: 0 });
    // bf16 has f32's exponent range: scaling by 2¹⁶ and back is exact, every bit the same.
    assert.deepStrictEqual(scaled.weights, bf16.weights);
  },
});

Deno.test({
  name: "AMP bf16 on a device made with initGpu({ f16: 'off' }): bf16 autocast and working " +
    "copies, no warning, and it trains",
  ...GPU_TEST,
  async fn() {
    const plain = await initGpu({ f16: "off", matmulTiling: "default", setDefault: false });
    assert.equal(plain.f16, false);
    const warnings = await capturedWarnings(async () => {
      const x = Tensor.zeros([3, 5], { gpu: plain });
      tidy(() =>
        autocast(() => assert.equal(matmul(x, x, { transB: true }).dtype, "bf16"), {
          gpu: plain,
          dtype: "bf16",
        })
      );
      x.dispose();
      const run = await trainMlp({ dtype: "bf16" }, 30, plain);
      assert.equal(run.copies, "bf16");
      assert.deepEqual(run.scaler, { enabled: false, scale: 1, skipped: 0 });
      const last = run.losses.slice(-5).reduce((a, b) => a + b, 0) / 5;
      assert.ok(last < 0.75 * run.losses[0], `trains: ${run.losses}`);
    });
    plain.destroy();
    assert.deepEqual(warnings.filter((w) => w.includes("shader-f16")), [], warnings.join());
  },
});

Deno.test({
  name: "a bf16 run (Dropout, BatchNorm, accumulation) saved mid-batch resumes bit for bit",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const path = `${dir}/run.safetensors`;
    const bf16Run = (seed: number): Run => ampRun(seed, { trainer: { dtype: "bf16" } });
    const straight = bf16Run(1);
    train(straight, 0, 11);
    const first = bf16Run(1);
    train(first, 0, 5);
    assert.equal((await first.trainer.stateDict()).microStep, 1);
    await saveTrainingState(path, first);
    const f16 = ampRun(7); // the default dtype: f16, with loss scaling
    await assert.rejects(
      loadTrainingState(path, f16),
      /saved in bf16 and this trainer runs f16: create it with \{ dtype: "bf16" \}.*nothing was loaded/,
    );
    const resumed = bf16Run(7); // other weights, other Dropout seed: everything comes from the file
    await loadTrainingState(path, resumed);
    assert.equal(resumed.trainer.masters!.dtype, "bf16");
    await assertCopiesRounded(resumed.trainer.masters!, "after the load");
    train(resumed, 5, 6);
    assert.deepEqual(await snapshot(resumed), await snapshot(straight));
    for (const r of [straight, first, f16, resumed]) {
      r.trainer.dispose();
      r.optimizer.dispose();
      r.model.dispose();
    }
    await Deno.remove(dir, { recursive: true });
  },
});

/** The peak GPU bytes of one warm AMP step of a tiny GPT in `dtype`, above what it held before. */
async function gptStepPeak(dtype: "f16" | "bf16"): Promise<{ step: number; total: number }> {
  const config = { vocab: 11, context: 32, layers: 2, dim: 32, heads: 4, seed: 3 };
  const model = new Gpt(config);
  const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
  const trainer = new AmpTrainer(model, optimizer, { dtype, maxGradNorm: 1 });
  assert.equal(trainer.masters?.dtype, dtype);
  const ids = Array.from(new RandomGenerator(5).uniform(2 * 8 * 32), (u) => Math.floor(u * 11));
  const x = Tensor.from(ids.slice(0, 256), [8, 32], { dtype: "i32" });
  const step = () => trainer.step(() => crossEntropy(model.forward(x), ids.slice(256))).dispose();
  step();
  step();
  await sharedGpu.sync();
  sharedGpu.resetPeakMemory();
  const before = sharedGpu.memoryStats().allocatedBytes;
  step();
  await sharedGpu.sync();
  const total = sharedGpu.memoryStats().peakBytes;
  trainer.dispose();
  optimizer.dispose();
  model.dispose();
  x.dispose();
  return { step: total - before, total };
}

Deno.test({
  name: "a bf16 training step's peak GPU memory is within 5% of the f16 step's" +
    (sharedGpu.f16 ? "" : " (ignored: the adapter has no shader-f16)"),
  ignore: !sharedGpu.f16,
  ...GPU_TEST,
  async fn() {
    const f16 = await gptStepPeak("f16");
    const bf16 = await gptStepPeak("bf16");
    const ratio = bf16.step / f16.step;
    assert.ok(Math.abs(ratio - 1) <= 0.05, `step peak bf16 ${bf16.step} vs f16 ${f16.step}`);
    assert.ok(Math.abs(bf16.total / f16.total - 1) <= 0.05, `${bf16.total} vs ${f16.total}`);
  },
});

Deno.test({
  name:
    "compareToF32 in bf16: the Linear runs in bf16 and drifts by bf16's rounding, more than f16's",
  ...GPU_TEST,
  async fn() {
    const model = new Sequential(new Linear(8, 16, { seed: new RandomGenerator(1) }));
    const x = Tensor.from(uniform(4 * 8, 3), [4, 8]);
    const loss = () => sum(model.forward(x));
    const report = await compareToF32(model, loss, { dtype: "bf16" });
    const linear = report.ops.find((d) => d.op === "linear")!;
    assert.equal(linear.dtype, "bf16");
    // Inputs and weights rounded to 8 significant bits: a relative error near 2⁻⁸, not 2⁻¹¹.
    assert.ok(
      linear.relativeError > 2e-4 && linear.relativeError < 2e-2,
      `${linear.relativeError}`,
    );
    if (sharedGpu.f16) {
      const f16 = (await compareToF32(model, loss)).ops.find((d) => d.op === "linear")!;
      assert.ok(f16.relativeError < linear.relativeError, `f16 ${f16.relativeError}`);
    }
    model.dispose();
    x.dispose();
  },
});
