/**
 * One GPT-2 124M training step's peak bytes: the modes of docs/gpt2.md's
 * memory table and the measurement itself, which `gpt2_memory_step.ts` runs
 * in a process of its own (see there why it prints as soon as the step is
 * recorded) and `bench.ts gpt2_memory` drives once per mode.
 *
 * @module
 */
import {
  AdamW,
  AmpTrainer,
  crossEntropy,
  type Gpu,
  type GradDType,
  RandomGenerator,
  type StateDtype,
  Tensor,
} from "../../mod.ts";
import { gpt2StepPeakBytes } from "./memory.ts";
import { GPT2_124M, gpt2Config, type Gpt2Sizes, initGpt2 } from "../../models/gpt2.ts";
import { Gpt } from "../../models/gpt.ts";

/** A row of the memory table. */
export interface Gpt2MemoryMode {
  mode: string;
  amp: boolean;
  dtype: "f16" | "bf16";
  checkpoint: boolean;
  /** The chunked head and loss (`model.loss`), or the logits whole. */
  fused: boolean;
  /** How AdamW keeps its moments (default f32). */
  states?: StateDtype;
  /** What the masters' gradients are kept in (default f32; the AMP dtype: apex O2). */
  grads?: GradDType;
}

/** The modes of the memory table. */
export const GPT2_MEMORY_MODES: readonly Gpt2MemoryMode[] = [
  { mode: "f32", amp: false, dtype: "f16", checkpoint: false, fused: true },
  { mode: "amp", amp: true, dtype: "f16", checkpoint: false, fused: true },
  { mode: "amp+ckpt", amp: true, dtype: "f16", checkpoint: true, fused: true },
  { mode: "bf16+ckpt", amp: true, dtype: "bf16", checkpoint: true, fused: true },
  { mode: "amp+ckpt+8bit", amp: true, dtype: "f16", checkpoint: true, fused: true, states: "8bit" },
  {
    mode: "amp+ckpt+8bit+f16 grads",
    amp: true,
    dtype: "f16",
    checkpoint: true,
    fused: true,
    states: "8bit",
    grads: "f16",
  },
  {
    mode: "amp+ckpt+bf16 states",
    amp: true,
    dtype: "f16",
    checkpoint: true,
    fused: true,
    states: "bf16",
  },
  // The unfused head's logits [4096, 50257] (823 MB in f32) exceed one buffer on many adapters.
  { mode: "amp+ckpt, unfused head", amp: true, dtype: "f16", checkpoint: true, fused: false },
];

/** The most bytes one buffer may hold and a kernel bind on this adapter. */
export function bufferLimit(gpu: Gpu): number {
  return Math.min(gpu.device.limits.maxBufferSize, gpu.device.limits.maxStorageBufferBindingSize);
}

/** Records one training step of a fresh GPT-2 of `sizes` in mode `m`; returns what to dispose. */
function recordStep(gpu: Gpu, sizes: Gpt2Sizes, m: Gpt2MemoryMode, ids: number[][]) {
  const [batch, context] = [ids.length, ids[0].length];
  const model = new Gpt(gpt2Config(sizes, 1, bufferLimit(gpu)));
  initGpt2(model, 1);
  if (m.checkpoint) model.blocks.checkpoint = sizes.layers;
  const optimizer = new AdamW(model.parameters(), {
    lr: 1e-4,
    weightDecay: 0.01,
    stateDtype: m.states ?? "f32",
  });
  const trainer = new AmpTrainer(model, optimizer, {
    enabled: m.amp,
    dtype: m.dtype,
    maxGradNorm: 1,
    gradDtype: m.grads ?? "f32",
  });
  const x = Tensor.from(ids.flat(), [batch, context], { dtype: "i32" });
  const targets = ids.flat().map((id) => (id * 7 + 1) % sizes.vocab);
  const loss = trainer.step(() =>
    m.fused ? model.loss(x, targets) : crossEntropy(model.forward(x), targets)
  );
  return [loss, x, trainer, optimizer, model];
}

/**
 * The peak bytes of one GPT-2 124M training step at `batch` × `context` in
 * mode `m`, read once the step is recorded (it may still be running), with
 * the preflight's estimate beside it.
 */
export async function measureGpt2Step(
  gpu: Gpu,
  m: Gpt2MemoryMode,
  batch: number,
  context: number,
): Promise<Record<string, unknown> & { peakBytes: number }> {
  const rng = new RandomGenerator(5);
  const ids = Array.from(
    { length: batch },
    () => Array.from(rng.uniform(context), (u) => Math.floor(u * GPT2_124M.vocab)),
  );
  // Compile the step's pipelines on a one-block model at batch 1 (same widths, same kernels).
  for (const t of recordStep(gpu, { ...GPT2_124M, layers: 1 }, m, ids.slice(0, 1))) t.dispose();
  await gpu.sync();
  gpu.resetPeakMemory();
  const start = performance.now();
  const made = recordStep(gpu, GPT2_124M, m, ids);
  const recordSeconds = (performance.now() - start) / 1000;
  const peakBytes = gpu.memoryStats().peakBytes;
  for (const t of made) t.dispose();
  const estimate = gpt2StepPeakBytes(GPT2_124M, {
    batch,
    context,
    amp: m.amp,
    checkpoint: m.checkpoint,
    training: true,
    sampleLength: 1,
    optimStates: m.states,
    gradDtype: m.grads,
  });
  return {
    bench: "gpt2_memory",
    mode: m.mode,
    model: `GPT-2 124M, batch ${batch} × ${context}`,
    recordSeconds,
    peakBytes,
    peakGiB: peakBytes / 2 ** 30,
    estimatedGiB: estimate / 2 ** 30,
  };
}
