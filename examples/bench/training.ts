/**
 * Training benchmarks: the MNIST MLP and CNN (f32, AMP, AMP + checkpointing),
 * a 32-block MLP whose memory is activations (checkpointing by √n segments
 * and by a budget), the tiny transformer of examples/tiny_gpt.ts, and a soak
 * run that must keep GPU memory and the JS heap flat.
 */
import { Gpt } from "../../models/gpt.ts";
import {
  Adam,
  AdamW,
  AmpTrainer,
  crossEntropy,
  GELU,
  type Gpu,
  LayerNorm,
  Linear,
  mean,
  type Module,
  NumericsInspector,
  RandomGenerator,
  type SegmentSpec,
  Sequential,
  square,
  Tensor,
} from "../../mod.ts";
import { disposeAll, type Result, timed } from "./harness.ts";
import { tunePending } from "../../gpu/mod.ts";
import { mnistCnn, mnistMlp } from "../mnist/model.ts";

/** A classifier to time: how to build it and the shape of its input batch. */
interface ClassifierSpec {
  bench: string;
  model: string;
  make(rng: RandomGenerator): Sequential;
  /** The input batch's shape (batch first). */
  input: number[];
}

/**
 * Steps/s and peak GPU memory of `spec`'s model trained with fused Adam on a
 * synthetic batch, in f32, AMP (f16), AMP in bf16 and AMP + checkpointing,
 * and AMP's ratios (f16 against f32, bf16 against f16).
 */
async function benchClassifier(gpu: Gpu, steps: number, spec: ClassifierSpec): Promise<Result[]> {
  const results: Result[] = [];
  const batch = spec.input[0], size = spec.input.reduce((a, b) => a * b, 1);
  for (const mode of ["f32", "amp", "amp bf16", "amp+ckpt"] as const) {
    const rng = new RandomGenerator(2);
    const model = spec.make(rng);
    if (mode === "amp+ckpt") model.checkpoint = "auto";
    const optimizer = new Adam(model.parameters(), { lr: 1e-3 });
    const trainer = new AmpTrainer(model, optimizer, {
      enabled: mode !== "f32",
      dtype: mode === "amp bf16" ? "bf16" : "f16",
    });
    const x = Tensor.from(rng.uniform(size), spec.input);
    const y = Tensor.from(Array.from({ length: batch }, (_, i) => i % 10), [batch], {
      dtype: "i32",
    });
    const step = () => trainer.step(() => crossEntropy(model.forward(x), y)).dispose();
    for (let i = 0; i < 3; i++) step();
    await gpu.sync();
    gpu.resetPeakMemory();
    const before = { ...gpu.batch.counters };
    const seconds = await timed(gpu, steps, step);
    results.push({
      bench: spec.bench,
      mode,
      model: spec.model,
      batch,
      optimizer: "Adam (fused)",
      stepsPerSec: 1 / seconds,
      msPerStep: seconds * 1000,
      dispatchesPerStep: (gpu.batch.counters.dispatches - before.dispatches) / (steps + 1),
      peakBytes: gpu.memoryStats().peakBytes,
    });
    disposeAll(trainer, optimizer, model, x, y);
  }
  const [f32, amp, bf16] = results;
  const ratio = (mode: string, run: Result, base: Result): Result => ({
    bench: spec.bench,
    mode,
    model: spec.model,
    speedup: (run.stepsPerSec as number) / (base.stepsPerSec as number),
    memoryRatio: run.peakBytes / base.peakBytes,
    peakBytes: run.peakBytes,
  });
  results.push(ratio("amp/f32", amp, f32), ratio("bf16/f16", bf16, amp));
  return results;
}

/** Timed rounds of {@link inspectOverhead}, alternating detached and attached. */
const INSPECT_ROUNDS = 7;

/**
 * ms/step of AMP training with a `NumericsInspector` attached and without,
 * timed in alternating rounds (a shared machine's noise falls on both): the
 * median round of each, and their ratio. `make` builds a model, its input
 * and its loss.
 */
async function inspectOverhead(
  gpu: Gpu,
  steps: number,
  row: { bench: string; model: string },
  make: () => { model: Module; loss: () => Tensor; free: () => void },
): Promise<Result> {
  const runs = [false, true].map((attached) => {
    const { model, loss, free } = make();
    const inspector = attached ? new NumericsInspector(model) : null;
    const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
    const trainer = new AmpTrainer(model, optimizer, { inspector: inspector ?? undefined });
    return {
      step: () => trainer.step(loss).dispose(),
      seconds: [] as number[],
      inspector,
      free: () => disposeAll(trainer, optimizer, model, { dispose: free }),
    };
  });
  const perRound = Math.max(2, Math.ceil(steps / INSPECT_ROUNDS));
  for (let round = 0; round < INSPECT_ROUNDS; round++) {
    for (const run of round % 2 ? [...runs].reverse() : runs) {
      run.seconds.push(await timed(gpu, perRound, run.step));
    }
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
  const [detached, attached] = runs.map((r) => median(r.seconds) * 1000);
  const report = await runs[1].inspector!.report(); // not timed: the read a log would do
  runs[1].inspector!.dispose();
  runs.forEach((r) => r.free());
  return {
    ...row,
    mode: "amp inspect",
    msPerStep: attached,
    msPerStepDetached: detached,
    inspectOverhead: attached / detached,
    inspectedRows: report.rows.length,
    stepsPerRound: perRound,
    rounds: INSPECT_ROUNDS,
    peakBytes: gpu.memoryStats().peakBytes,
  };
}

/** The MNIST MLP the peers were measured on (784-256-256-10, batch 128). */
export async function benchMlp(gpu: Gpu, steps: number): Promise<Result[]> {
  const row = { bench: "mlp", model: "784-256-256-10" };
  const results = await benchClassifier(gpu, steps, { ...row, make: mnistMlp, input: [128, 784] });
  results.push(
    await inspectOverhead(gpu, steps, row, () => {
      const rng = new RandomGenerator(2), model = mnistMlp(rng);
      const x = Tensor.from(rng.uniform(128 * 784), [128, 784]);
      const y = Array.from({ length: 128 }, (_, i) => i % 10);
      return { model, loss: () => crossEntropy(model.forward(x), y), free: () => x.dispose() };
    }),
  );
  return results;
}

/** The MNIST CNN of `mnist.ts --model cnn` (batch 128; BatchNorm stays fp32 under AMP). */
export function benchCnnTraining(gpu: Gpu, steps: number): Promise<Result[]> {
  return benchClassifier(gpu, steps, {
    bench: "cnn",
    model: "conv32-conv64 MNIST CNN",
    make: mnistCnn,
    input: [128, 1, 28, 28],
  });
}

/** One training step's time and peak memory for a 32-block MLP, with checkpointing as `spec` says. */
async function deepStep(gpu: Gpu, spec: SegmentSpec | null, amp: boolean, steps: number) {
  const rng = new RandomGenerator(3);
  const layers: Module[] = [];
  for (let i = 0; i < 32; i++) {
    layers.push(new Linear(256, 256, { seed: rng }), new LayerNorm(256), new GELU());
  }
  const model = new Sequential(...layers);
  model.checkpoint = spec;
  const optimizer = new Adam(model.parameters(), { lr: 1e-4 });
  const trainer = new AmpTrainer(model, optimizer, { enabled: amp });
  const x = Tensor.from(rng.uniform(512 * 256, -1, 1), [512, 256]);
  const step = () => trainer.step(() => mean(square(model.forward(x)))).dispose();
  step();
  await gpu.sync();
  // Not activations: weights, optimizer state and working copies (allocated
  // between steps) and the fp32 gradients that backward fills.
  const gradientBytes = model.parameters().reduce((sum, p) => sum + p.size * 4, 0);
  const base = gpu.memoryStats().allocatedBytes + gradientBytes;
  gpu.resetPeakMemory();
  const seconds = await timed(gpu, steps, step);
  const activationPeak = gpu.memoryStats().peakBytes - base;
  const result = {
    stepsPerSec: 1 / seconds,
    peakBytes: gpu.memoryStats().peakBytes,
    activationPeakBytes: activationPeak,
    plan: model.lastCheckpointPlan,
  };
  trainer.dispose();
  optimizer.dispose();
  model.dispose();
  x.dispose();
  return result;
}

export async function benchCheckpoint(gpu: Gpu, steps: number): Promise<Result[]> {
  const n = Math.max(2, Math.ceil(steps / 20));
  const plain = await deepStep(gpu, null, true, n);
  const auto = await deepStep(gpu, "auto", true, n);
  const budgetBytes = Math.round(plain.activationPeakBytes / 3);
  const budget = await deepStep(gpu, { budgetBytes }, true, n);
  const row = (mode: string, r: typeof plain): Result => ({
    bench: "deep_mlp",
    mode,
    model: "32 × (Linear 256, LayerNorm, GELU), batch 512",
    stepsPerSec: r.stepsPerSec,
    peakBytes: r.peakBytes,
    activationPeakBytes: r.activationPeakBytes,
    segments: r.plan?.segments.length ?? 0,
  });
  return [
    row("amp", plain),
    row("amp+ckpt", auto),
    {
      ...row("amp+ckpt budget", budget),
      budgetBytes,
      estimatedPeakBytes: budget.plan?.estimatedPeakBytes,
      withinBudget: budget.activationPeakBytes <= budgetBytes,
    },
    {
      bench: "deep_mlp",
      mode: "amp+ckpt/amp",
      model: "32 × (Linear 256, LayerNorm, GELU), batch 512",
      activationMemoryRatio: auto.activationPeakBytes / plain.activationPeakBytes,
      stepTimeOverhead: plain.stepsPerSec / auto.stepsPerSec,
      peakBytes: auto.peakBytes,
    },
  ];
}

/**
 * A long AMP run of the MNIST-sized MLP: GPU bytes allocated and the JS heap
 * after warm-up and at the end, which must stay flat (no leak through the
 * pool, the tape or bind groups).
 */
export async function benchSoak(gpu: Gpu, steps: number): Promise<Result[]> {
  const total = Math.max(steps * 20, 400), warmup = Math.min(100, total / 4);
  const rng = new RandomGenerator(4);
  const model = mnistMlp(rng);
  const optimizer = new Adam(model.parameters(), { lr: 1e-3 });
  const trainer = new AmpTrainer(model, optimizer);
  const labels = Array.from({ length: 128 }, (_, i) => i % 10);
  const pixels = rng.uniform(128 * 784);
  const snapshot = () => {
    (globalThis as { gc?: () => void }).gc?.();
    return { gpuBytes: gpu.memoryStats().allocatedBytes, heapBytes: Deno.memoryUsage().heapUsed };
  };
  let start = snapshot();
  const began = performance.now();
  for (let i = 0; i < total; i++) {
    // A fresh upload every step, as a data loader does.
    trainer.step(() => crossEntropy(model.forward(Tensor.from(pixels, [128, 784])), labels))
      .dispose();
    if (i === warmup) {
      await gpu.sync();
      await tunePending(gpu); // what the warm-up ran, before the measured steps
      start = snapshot();
    }
  }
  await gpu.sync();
  const end = snapshot();
  const seconds = (performance.now() - began) / 1000;
  trainer.dispose();
  optimizer.dispose();
  model.dispose();
  return [{
    bench: "soak",
    mode: "amp",
    model: "784-256-256-10",
    steps: total,
    stepsPerSec: total / seconds,
    gpuBytesAfterWarmup: start.gpuBytes,
    gpuBytesAtEnd: end.gpuBytes,
    heapBytesAfterWarmup: start.heapBytes,
    heapBytesAtEnd: end.heapBytes,
    gpuFlat: start.gpuBytes === end.gpuBytes,
    peakBytes: gpu.memoryStats().peakBytes,
  }];
}

/** The tiny transformer of examples/tiny_gpt.ts on synthetic tokens: f32, AMP, AMP + checkpointing. */
export async function benchTinyGpt(gpu: Gpu, steps: number): Promise<Result[]> {
  const config = { vocab: 27, context: 32, layers: 2, dim: 64, heads: 4, seed: 1 };
  const batch = 32, n = Math.max(2, Math.ceil(steps / 10));
  const rng = new RandomGenerator(7);
  const ids = Array.from(
    rng.uniform(batch * (config.context + 1)),
    (u) => Math.floor(u * config.vocab),
  );
  const inputs = ids.filter((_, i) => i % (config.context + 1) !== config.context);
  const targets = ids.filter((_, i) => i % (config.context + 1) !== 0);
  const results: Result[] = [];
  // "unfused": the reference attention (matmuls around a saved T×T softmax), for comparison.
  for (const mode of ["f32", "amp", "amp+ckpt", "f32 unfused", "amp unfused"] as const) {
    const model = new Gpt({ ...config, fusedAttention: !mode.endsWith("unfused") });
    if (mode === "amp+ckpt") model.blocks.checkpoint = config.layers;
    const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
    const trainer = new AmpTrainer(model, optimizer, { enabled: !mode.startsWith("f32") });
    const x = Tensor.from(inputs, [batch, config.context], { dtype: "i32" });
    const y = Tensor.from(targets, [batch * config.context], { dtype: "i32" });
    const step = () => trainer.step(() => crossEntropy(model.forward(x), y)).dispose();
    step();
    await gpu.sync();
    gpu.resetPeakMemory();
    const seconds = await timed(gpu, n, step);
    results.push({
      bench: "tiny_gpt",
      mode,
      model:
        `${config.layers} blocks, dim ${config.dim}, ${config.heads} heads, context ${config.context}`,
      batch,
      stepsPerSec: 1 / seconds,
      peakBytes: gpu.memoryStats().peakBytes,
    });
    disposeAll(trainer, optimizer, model, x, y);
  }
  const [f32, amp, ckpt, f32Unfused, ampUnfused] = results;
  const speedup = (a: Result, b: Result) => (a.stepsPerSec as number) / (b.stepsPerSec as number);
  results.push({
    bench: "tiny_gpt",
    mode: "ratios",
    model: "amp/f32, amp+ckpt/amp, and fused/unfused attention",
    ampSpeedup: (amp.stepsPerSec as number) / (f32.stepsPerSec as number),
    ampMemoryRatio: amp.peakBytes / f32.peakBytes,
    checkpointMemoryRatio: ckpt.peakBytes / amp.peakBytes,
    checkpointTimeOverhead: (amp.stepsPerSec as number) / (ckpt.stepsPerSec as number),
    fusedAttentionSpeedupF32: speedup(f32, f32Unfused),
    fusedAttentionSpeedupAmp: speedup(amp, ampUnfused),
    fusedAttentionMemoryRatioAmp: amp.peakBytes / ampUnfused.peakBytes,
    peakBytes: ckpt.peakBytes,
  });
  const model =
    `${config.layers} blocks, dim ${config.dim}, ${config.heads} heads, context ${config.context}`;
  results.push(
    await inspectOverhead(gpu, n, { bench: "tiny_gpt", model }, () => {
      const gpt = new Gpt(config);
      const x = Tensor.from(inputs, [batch, config.context], { dtype: "i32" });
      const y = Tensor.from(targets, [batch * config.context], { dtype: "i32" });
      return {
        model: gpt,
        loss: () => crossEntropy(gpt.forward(x), y),
        free: () => disposeAll(x, y),
      };
    }),
  );
  return results;
}
