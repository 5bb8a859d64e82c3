/**
 * Benchmarks: one JSON object per line on stdout, a readable table on
 * stderr. `deno task bench` runs every entry; `deno task bench mlp` runs one.
 *
 * Entries: `matmul` (GFLOP/s, f32 and f16, square and MLP-shaped products)
 * and `mlp` (784-256-256-10 MLP, batch 128, fused Adam: training steps/s and
 * peak GPU memory in f32, AMP and AMP + checkpointing, and their ratios)
 * and `checkpoint` (a 32-block MLP where activations dominate: activation
 * memory and step time with √n segments and with a memory budget), `tiny_gpt`
 * (the example's transformer in f32, AMP and AMP + checkpointing) and `soak`
 * (20 × --steps AMP steps: GPU bytes and JS heap after warm-up and at the end).
 * Synthetic data, so it runs anywhere.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { TinyGpt } from "./tiny_gpt_model.ts";
import {
  Adam,
  AdamW,
  AmpTrainer,
  crossEntropy,
  type FloatDType,
  GELU,
  type Gpu,
  initGpu,
  LayerNorm,
  Linear,
  matmul,
  mean,
  type Module,
  RandomGenerator,
  type SegmentSpec,
  Sequential,
  square,
  Tensor,
  tidy,
} from "../mod.ts";

/** One benchmark result line. */
interface Result extends Record<string, unknown> {
  bench: string;
  mode: string;
  peakBytes: number;
}

const HELP = `Usage: deno task bench [ENTRY...] [--steps N] [--repeats N]

Entries: matmul, mlp, checkpoint, tiny_gpt, soak (default: all). Output: one JSON object per line on
stdout; a table on stderr.
  --steps N     timed MLP training steps (default 100)
  --repeats N   timed matmuls per shape (default 10)
  -h, --help    show this help`;

/** The 784-256-256-10 MLP the peers were measured on (ReLU fused into the matmuls). */
function mnistMlp(rng: RandomGenerator): Sequential {
  return new Sequential(
    new Linear(784, 256, { seed: rng, activation: "relu" }),
    new Linear(256, 256, { seed: rng, activation: "relu" }),
    new Linear(256, 10, { seed: rng }),
  );
}

/** Frees whatever a benchmark made. */
function disposeAll(...things: { dispose(): void }[]): void {
  for (const thing of things) thing.dispose();
}

/** Runs `fn` `count` times between two GPU syncs and returns seconds per run. */
async function timed(gpu: Gpu, count: number, fn: () => void): Promise<number> {
  fn(); // warm-up: compile pipelines, fill the pool
  await gpu.sync();
  const start = performance.now();
  for (let i = 0; i < count; i++) fn();
  await gpu.sync();
  return (performance.now() - start) / 1000 / count;
}

async function benchMatmul(gpu: Gpu, repeats: number): Promise<Result[]> {
  const shapes = [
    { m: 512, k: 512, n: 512, label: "512x512x512" },
    { m: 128, k: 784, n: 256, label: "128x784x256 (MLP layer 1)" },
  ];
  const results: Result[] = [];
  for (const dtype of ["f32", "f16"] as FloatDType[]) {
    if (dtype === "f16" && !gpu.f16) continue;
    for (const { m, k, n, label } of shapes) {
      const rng = new RandomGenerator(1);
      const a = Tensor.from(rng.uniform(m * k, -1, 1), [m, k], { dtype });
      const b = Tensor.from(rng.uniform(k * n, -1, 1), [k, n], { dtype });
      gpu.resetPeakMemory();
      const seconds = await timed(gpu, repeats, () => tidy(() => void matmul(a, b)));
      results.push({
        bench: "matmul",
        mode: dtype,
        shape: label,
        gflops: (2 * m * n * k) / seconds / 1e9,
        msPerOp: seconds * 1000,
        peakBytes: gpu.memoryStats().peakBytes,
      });
      a.dispose();
      b.dispose();
    }
  }
  return results;
}

async function benchMlp(gpu: Gpu, steps: number): Promise<Result[]> {
  const results: Result[] = [];
  for (const mode of ["f32", "amp", "amp+ckpt"] as const) {
    const batch = 128;
    const rng = new RandomGenerator(2);
    const model = mnistMlp(rng);
    if (mode === "amp+ckpt") model.checkpoint = "auto";
    const optimizer = new Adam(model.parameters(), { lr: 1e-3 });
    const trainer = new AmpTrainer(model, optimizer, { enabled: mode !== "f32" });
    const x = Tensor.from(rng.uniform(batch * 784), [batch, 784]);
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
      bench: "mlp",
      mode,
      model: "784-256-256-10",
      batch,
      optimizer: "Adam (fused)",
      stepsPerSec: 1 / seconds,
      msPerStep: seconds * 1000,
      dispatchesPerStep: (gpu.batch.counters.dispatches - before.dispatches) / (steps + 1),
      peakBytes: gpu.memoryStats().peakBytes,
    });
    disposeAll(trainer, optimizer, model, x, y);
  }
  const [f32, amp] = results;
  results.push({
    bench: "mlp",
    mode: "amp/f32",
    model: "784-256-256-10",
    speedup: (amp.stepsPerSec as number) / (f32.stepsPerSec as number),
    memoryRatio: amp.peakBytes / f32.peakBytes,
    peakBytes: amp.peakBytes,
  });
  return results;
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

async function benchCheckpoint(gpu: Gpu, steps: number): Promise<Result[]> {
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
async function benchSoak(gpu: Gpu, steps: number): Promise<Result[]> {
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
async function benchTinyGpt(gpu: Gpu, steps: number): Promise<Result[]> {
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
  for (const mode of ["f32", "amp", "amp+ckpt"] as const) {
    const model = new TinyGpt(config);
    if (mode === "amp+ckpt") model.blocks.checkpoint = config.layers;
    const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
    const trainer = new AmpTrainer(model, optimizer, { enabled: mode !== "f32" });
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
  const [f32, amp, ckpt] = results;
  results.push({
    bench: "tiny_gpt",
    mode: "ratios",
    model: "amp/f32 and amp+ckpt/amp",
    ampSpeedup: (amp.stepsPerSec as number) / (f32.stepsPerSec as number),
    ampMemoryRatio: amp.peakBytes / f32.peakBytes,
    checkpointMemoryRatio: ckpt.peakBytes / amp.peakBytes,
    checkpointTimeOverhead: (amp.stepsPerSec as number) / (ckpt.stepsPerSec as number),
    peakBytes: ckpt.peakBytes,
  });
  return results;
}

const ENTRIES: Record<
  string,
  (gpu: Gpu, o: { steps: number; repeats: number }) => Promise<Result[]>
> = {
  matmul: (gpu, o) => benchMatmul(gpu, o.repeats),
  mlp: (gpu, o) => benchMlp(gpu, o.steps),
  checkpoint: (gpu, o) => benchCheckpoint(gpu, o.steps),
  tiny_gpt: (gpu, o) => benchTinyGpt(gpu, o.steps),
  soak: (gpu, o) => benchSoak(gpu, o.steps),
};

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    args: Deno.args,
    allowPositionals: true,
    options: {
      steps: { type: "string", default: "100" },
      repeats: { type: "string", default: "10" },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) return console.log(HELP);
  const unknown = positionals.filter((p) => !(p in ENTRIES));
  if (unknown.length > 0) {
    console.error(
      `bench: unknown entry ${unknown.join(", ")}; entries: ${Object.keys(ENTRIES).join(", ")}`,
    );
    Deno.exit(2);
  }
  const options = { steps: Number(values.steps), repeats: Number(values.repeats) };
  if (!(options.steps >= 1 && options.repeats >= 1)) {
    console.error("bench: --steps and --repeats must be positive integers");
    Deno.exit(2);
  }
  const gpu = await initGpu();
  const context = {
    adapter: gpu.adapterName,
    deno: Deno.version.deno,
    f16: gpu.f16,
    matmulTiling: gpu.matmulTiling,
  };
  for (const name of positionals.length > 0 ? positionals : Object.keys(ENTRIES)) {
    for (const result of await ENTRIES[name](gpu, options)) {
      console.log(JSON.stringify({ ...result, ...context }));
      const figure = "gflops" in result
        ? `${(result.gflops as number).toFixed(2)} GFLOP/s`
        : "speedup" in result
        ? `×${(result.speedup as number).toFixed(2)} speed`
        : "ampMemoryRatio" in result
        ? `mem ×${(result.ampMemoryRatio as number).toFixed(2)} amp, ×${
          (result.checkpointMemoryRatio as number).toFixed(2)
        } ckpt`
        : "gpuFlat" in result
        ? `GPU ${result.gpuFlat ? "flat" : "GROWS"}, heap ${
          (((result.heapBytesAtEnd as number) - (result.heapBytesAfterWarmup as number)) / 2 ** 20)
            .toFixed(1)
        } MiB`
        : "activationMemoryRatio" in result
        ? `×${(result.activationMemoryRatio as number).toFixed(2)} mem ×${
          (result.stepTimeOverhead as number).toFixed(2)
        } time`
        : `${(result.stepsPerSec as number).toFixed(1)} steps/s`;
      const shape = (result.shape as string | undefined) ?? (result.model as string);
      console.error(
        `${result.bench.padEnd(8)} ${result.mode.padEnd(5)} ${shape.padEnd(28)} ${
          figure.padStart(16)
        }` +
          `  peak ${(result.peakBytes / 2 ** 20).toFixed(2)} MiB`,
      );
    }
  }
  gpu.destroy();
}

if (import.meta.main) await main();
