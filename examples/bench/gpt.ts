/**
 * The GPT benchmark at real size: nanoGPT's shakespeare-char model (6 layers,
 * 6 heads, dim 384, context 256, batch 64, vocab 65) trained with AdamW on
 * synthetic ids, in f32, AMP and AMP with every block checkpointed: ms/step,
 * steps/s, peak bytes, the loss after the timed steps (a broken step shows),
 * and the profiler's top kernels of one f32 and one AMP step with their GPU
 * time against the step's wall time (the gap is the GPU waiting on
 * JavaScript and submits). A fourth run, "amp unfused", is AMP with the
 * reference attention (matmuls around a saved T×T softmax), for the fused
 * op's time and memory; a fifth, "amp bf16", is AMP in bf16 (its speed and
 * memory against AMP's in the "ratios" row); a sixth, "amp captured", is AMP
 * with the step captured (`trainer.capture`, replayed), timed over three
 * times the steps, with its wall time per step against its GPU time (the
 * "captured" row: on a GPU the two should agree within 5%, the GPU never
 * waiting on JavaScript). On GPUs each mode's first step
 * is followed by per-shape matmul and attention tuning (`tuneMatmulShapes`,
 * `tuneAttentionShapes`) before the timed steps. A
 * "tuning" row says what the start-up tuning picked for each matmul class
 * and attention dtype, and each matmul and attention shape's pick, and how fast. `--size small`
 * (the default on CPU adapters) shrinks it to run in seconds there.
 */
import { Gpt, type GptConfig } from "../../models/gpt.ts";
import {
  AdamW,
  AmpTrainer,
  crossEntropy,
  type Gpu,
  type ProfileReport,
  RandomGenerator,
  Tensor,
} from "../../mod.ts";
import { type BenchOptions, disposeAll, resolveSize, type Result, timed } from "./harness.ts";
import { gptStepFlops } from "./flops.ts";
import { shapePicks, shapeTable, tuneShapesForBench } from "./tuning.ts";

/** A GPT's sizes and its batch (the model's other options keep their defaults). */
export type GptBenchConfig =
  & Required<Pick<GptConfig, "vocab" | "context" | "layers" | "dim" | "heads" | "seed">>
  & { batch: number };

/** The sizes of each benchmark size. */
export function gptConfig(size: "real" | "small"): GptBenchConfig {
  return size === "real"
    ? { vocab: 65, context: 256, layers: 6, dim: 384, heads: 6, batch: 64, seed: 1 }
    : { vocab: 65, context: 64, layers: 2, dim: 128, heads: 4, batch: 8, seed: 1 };
}

/** Synthetic ids: inputs [B, T] and next-token targets [B·T] (i32). */
export function syntheticBatch(g: GptBenchConfig): { x: Tensor; y: Tensor } {
  const n = g.batch * g.context;
  const ids = Array.from(
    new RandomGenerator(7).uniform(n + g.batch),
    (u) => Math.floor(u * g.vocab),
  );
  const inputs = ids.filter((_, i) => i % (g.context + 1) !== g.context).slice(0, n);
  const targets = ids.filter((_, i) => i % (g.context + 1) !== 0).slice(0, n);
  return {
    x: Tensor.from(inputs, [g.batch, g.context], { dtype: "i32" }),
    y: Tensor.from(targets, [n], { dtype: "i32" }),
  };
}

/** Kernels a profile lists in the results: the rest are a few percent of the step. */
const TOP_KERNELS = 10;

/** One profiled step: its GPU and wall ms and its top kernels (the table goes to stderr). */
async function profiledStep(gpu: Gpu, mode: string, step: () => void) {
  const report: ProfileReport = await gpu.profile(step, { print: false });
  console.error(
    `gpt ${mode}, one step: ` + report.table().split("\n").slice(0, TOP_KERNELS + 2).join("\n"),
  );
  return {
    profile: {
      gpuMs: report.gpuMs,
      wallMs: report.wallMs,
      dispatches: report.dispatches,
      timing: report.timing,
    },
    topKernels: report.rows.slice(0, TOP_KERNELS).map((r) => ({
      kernel: r.kernel,
      config: r.config,
      calls: r.calls,
      ms: r.totalMs,
      share: r.share,
      tflops: r.tflops,
      gbPerSec: r.gbPerSec,
    })),
  };
}

/** The modes the GPT step runs in (see the module comment). */
export const GPT_MODES = [
  "f32",
  "amp",
  "amp+ckpt",
  "amp unfused",
  "amp bf16",
  "amp captured",
] as const;

/** Timed steps of a captured mode, per step of the others: its wall time per step is its figure. */
const CAPTURED_STEPS = 3;

/**
 * The GPT step in `modes` (default all: f32, AMP, AMP + checkpointing,
 * unfused attention, bf16), the ratios between them when all ran, and the
 * start-up tuning's picks.
 */
export async function benchGpt(
  gpu: Gpu,
  o: BenchOptions,
  modes: readonly (typeof GPT_MODES)[number][] = GPT_MODES,
): Promise<Result[]> {
  const size = resolveSize(gpu, o.size);
  const g = gptConfig(size);
  const steps = Math.max(2, Math.ceil(o.steps / 10));
  const { x, y } = syntheticBatch(g);
  const label = `${g.layers} layers, ${g.heads} heads, dim ${g.dim}, context ${g.context}, ` +
    `batch ${g.batch}, vocab ${g.vocab}`;
  const results: Result[] = [];
  for (const mode of modes) {
    const model = new Gpt({ ...g, fusedAttention: mode !== "amp unfused" });
    if (mode === "amp+ckpt") model.blocks.checkpoint = g.layers;
    const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
    const trainer = new AmpTrainer(model, optimizer, {
      enabled: mode !== "f32",
      dtype: mode === "amp bf16" ? "bf16" : "f16",
      maxGradNorm: 1,
    });
    let loss: Tensor | null = null;
    const captured = mode === "amp captured"
      ? trainer.capture((a, b) => crossEntropy(model.forward(a), b))
      : null;
    const step = () => {
      loss?.dispose();
      loss = captured ? captured.run(x, y) : trainer.step(() => crossEntropy(model.forward(x), y));
    };
    step();
    await gpu.sync();
    // Between steps: time each product this step dispatched at its own shape (GPUs).
    await tuneShapesForBench(gpu, o.tuning);
    // A captured step records its first steps (again after the tuning above), then replays.
    for (let i = 0; captured && !captured.captured && i < 6; i++) step();
    gpu.resetPeakMemory();
    const before = gpu.batch.counters.dispatches;
    const count = captured ? CAPTURED_STEPS * steps : steps;
    const seconds = await timed(gpu, count, step);
    const dispatchesPerStep = (gpu.batch.counters.dispatches - before) / (count + 1);
    const finalLoss = await loss!.item();
    const profiled = mode === "f32" || mode === "amp" || captured
      ? await profiledStep(gpu, mode, step)
      : {};
    results.push({
      bench: "gpt",
      mode,
      model: label,
      size,
      msPerStep: seconds * 1000,
      stepsPerSec: 1 / seconds,
      tflops: gptStepFlops(g) / seconds / 1e12,
      dispatchesPerStep,
      finalLoss,
      peakBytes: gpu.memoryStats().peakBytes,
      ...(captured && { replayedSteps: captured.stats.replayed }),
      ...profiled,
    });
    (loss as Tensor | null)?.dispose();
    disposeAll(trainer, optimizer, model);
  }
  disposeAll(x, y);
  const shapes = shapePicks(gpu);
  if (shapes.length > 0) console.error(shapeTable(shapes, o.tuning.shapeSeconds));
  const [f32, amp, ckpt, unfused, bf16] = results;
  const ampRun = results.find((r) => r.mode === "amp");
  const capturedRun = results.find((r) => r.mode === "amp captured");
  if (ampRun && capturedRun) {
    const gpuMs = (capturedRun.profile as { gpuMs: number }).gpuMs;
    results.push({
      bench: "gpt",
      mode: "captured",
      model: "amp captured against amp; a replayed step's wall time against its GPU time",
      size,
      capturedSpeedup: (capturedRun.stepsPerSec as number) / (ampRun.stepsPerSec as number),
      capturedWallMs: capturedRun.msPerStep,
      capturedGpuMs: gpuMs,
      wallOverGpu: (capturedRun.msPerStep as number) / gpuMs,
      peakBytes: capturedRun.peakBytes,
    });
  }
  if (modes.length === GPT_MODES.length) {
    results.push({
      bench: "gpt",
      mode: "ratios",
      model: "amp/f32, amp+ckpt/amp, fused/unfused attention under amp, and bf16/f16 amp",
      size,
      ampSpeedup: (amp.stepsPerSec as number) / (f32.stepsPerSec as number),
      ampMemoryRatio: amp.peakBytes / f32.peakBytes,
      checkpointMemoryRatio: ckpt.peakBytes / amp.peakBytes,
      fusedAttentionSpeedup: (amp.stepsPerSec as number) / (unfused.stepsPerSec as number),
      fusedAttentionMemoryRatio: amp.peakBytes / unfused.peakBytes,
      bf16Speedup: (bf16.stepsPerSec as number) / (amp.stepsPerSec as number),
      bf16MemoryRatio: bf16.peakBytes / amp.peakBytes,
      peakBytes: ckpt.peakBytes,
    });
  }
  results.push({
    bench: "gpt",
    mode: "tuning",
    model: "picks: matmul tiling per class, attention plan per dtype, matmul tiling per shape",
    size,
    tuningSeconds: o.tuning.seconds,
    shapeTuningSeconds: o.tuning.shapeSeconds,
    matmul: o.tuning.matmul,
    attention: o.tuning.attention,
    shapes,
    peakBytes: 0,
  });
  return results;
}
