/**
 * GPT-2 benchmarks (`bench.ts gpt2`, `bench.ts gpt2_memory`), random weights
 * of GPT-2's shapes (vocabulary 50257), so they need no download:
 * - `gpt2`: sampling's time per token at several positions, with the KV
 *   cache (flat: every step attends over the cache's fixed length) and
 *   recomputing the whole context (growing with the position);
 * - `gpt2_memory`: one training step of GPT-2 124M at batch 8 × 512 (the
 *   README's table) in f32, AMP, AMP + checkpointing and bf16 +
 *   checkpointing, and AMP + checkpointing with the unfused head (logits
 *   whole) where one buffer holds them, each from a fresh model: the step's
 *   peak bytes (weights, AdamW state and activations) and the preflight's
 *   estimate beside it. The buffer pool allocates as ops are recorded, so the
 *   peak is read once the step is recorded, without reading the loss back
 *   (recording still waits for the GPU at times: on a CPU adapter a 124M step
 *   at this size takes many minutes, and did not finish on a shared 2-vCPU
 *   machine). The
 *   peak does not depend on the adapter. `--size small` runs batch 2 × 128.
 *
 * @module
 */
import {
  AdamW,
  AmpTrainer,
  crossEntropy,
  type Gpu,
  noGrad,
  RandomGenerator,
  Tensor,
  tidy,
} from "../mod.ts";
import { type BenchOptions, disposeAll, resolveSize, type Result, warmUp } from "./_bench.ts";
import { KvCache } from "./gpt2_generate.ts";
import { gpt2StepPeakBytes } from "./gpt2_memory.ts";
import { GPT2_124M, gpt2Config, type Gpt2Sizes, initGpt2 } from "./gpt2_weights.ts";
import { TinyGpt } from "./tiny_gpt_model.ts";

/** The most bytes one buffer may hold and a kernel bind on this adapter. */
function bufferLimit(gpu: Gpu): number {
  return Math.min(gpu.device.limits.maxBufferSize, gpu.device.limits.maxStorageBufferBindingSize);
}

/** Per-token milliseconds at a position: `tokens` steps starting there, after one untimed. */
async function msPerToken(
  gpu: Gpu,
  step: (position: number) => Tensor,
  at: number,
  tokens: number,
) {
  await warmUp(gpu, () => step(at - 1).dispose());
  const start = performance.now();
  for (let i = 0; i < tokens; i++) {
    const logits = step(at + i);
    await logits.read(); // sampling reads every token's logits
    logits.dispose();
  }
  return (performance.now() - start) / tokens;
}

/** Sampling's ms per token with the KV cache and by recomputing, at a few positions. */
export async function benchGpt2(gpu: Gpu, o: BenchOptions): Promise<Result[]> {
  const real = resolveSize(gpu, o.size) === "real";
  const sizes: Gpt2Sizes = real ? GPT2_124M : { ...GPT2_124M, layers: 2, dim: 128, heads: 4 };
  const length = real ? 1024 : 512, tokens = real ? 8 : 4;
  const model = new TinyGpt(gpt2Config(sizes, 1, bufferLimit(gpu)));
  model.eval();
  const ids = Array.from(new RandomGenerator(3).uniform(length), (u) => Math.floor(u * 50257));
  const positions = real ? [16, 256, 512, 1000] : [16, 128, 256, 500];
  const results: Result[] = [];
  const cache = new KvCache(model, 1, length);
  const prefill = (to: number) => {
    while (cache.position < to) cache.step([ids[cache.position]]).dispose();
  };
  for (const at of positions) {
    prefill(at - 1);
    const ms = await msPerToken(gpu, () => cache.step([ids[cache.position]]), at, tokens);
    results.push({
      bench: "gpt2",
      mode: "kv cache",
      model: `${sizes.layers} layers, width ${sizes.dim}, cache ${length}`,
      position: at,
      msPerToken: ms,
      peakBytes: 0,
    });
  }
  cache.dispose();
  for (const at of positions) {
    const whole = (p: number) =>
      noGrad(() =>
        tidy(() => {
          const x = Tensor.from(ids.slice(0, p + 1), [1, p + 1], { dtype: "i32" });
          return model.forward(x);
        })
      );
    results.push({
      bench: "gpt2",
      mode: "recompute",
      model: `${sizes.layers} layers, width ${sizes.dim}`,
      position: at,
      msPerToken: await msPerToken(gpu, whole, at, Math.max(1, tokens / 2)),
      peakBytes: 0,
    });
  }
  model.dispose();
  return results;
}

/** The modes of the memory table. */
const MODES = [
  { mode: "f32", amp: false, dtype: "f16", checkpoint: false, fused: true },
  { mode: "amp", amp: true, dtype: "f16", checkpoint: false, fused: true },
  { mode: "amp+ckpt", amp: true, dtype: "f16", checkpoint: true, fused: true },
  { mode: "bf16+ckpt", amp: true, dtype: "bf16", checkpoint: true, fused: true },
  // The unfused head's logits [4096, 50257] (823 MB in f32) exceed one buffer on many adapters.
  { mode: "amp+ckpt, unfused head", amp: true, dtype: "f16", checkpoint: true, fused: false },
] as const;

/** One training step of GPT-2 124M per mode: its peak bytes. */
export async function benchGpt2Memory(gpu: Gpu, o: BenchOptions): Promise<Result[]> {
  const real = resolveSize(gpu, o.size) === "real";
  const batch = real ? 8 : 2, context = real ? 512 : 128;
  const rng = new RandomGenerator(5);
  const ids = Array.from(rng.uniform(batch * context), (u) => Math.floor(u * 50257));
  const targets = Array.from(rng.uniform(batch * context), (u) => Math.floor(u * 50257));
  const results: Result[] = [];
  const limit = bufferLimit(gpu);
  for (const m of MODES) {
    if (!m.fused && 4 * batch * context * 50257 > limit) continue; // the logits would not fit
    await gpu.sync();
    gpu.resetPeakMemory();
    const model = new TinyGpt(gpt2Config(GPT2_124M, 1, bufferLimit(gpu)));
    initGpt2(model, 1);
    if (m.checkpoint) model.blocks.checkpoint = GPT2_124M.layers;
    const optimizer = new AdamW(model.parameters(), { lr: 1e-4, weightDecay: 0.01 });
    const trainer = new AmpTrainer(model, optimizer, {
      enabled: m.amp,
      dtype: m.dtype,
      maxGradNorm: 1,
    });
    const x = Tensor.from(ids, [batch, context], { dtype: "i32" });
    const start = performance.now();
    const loss = trainer.step(() =>
      m.fused ? model.loss(x, targets) : crossEntropy(model.forward(x), targets)
    );
    // Every buffer of the step is allocated (and the freed ones returned) by now.
    const seconds = (performance.now() - start) / 1000;
    const peakBytes = gpu.memoryStats().peakBytes;
    results.push({
      bench: "gpt2_memory",
      mode: m.mode,
      model: `GPT-2 124M, batch ${batch} × ${context}`,
      recordSeconds: seconds,
      peakBytes,
      peakGiB: peakBytes / 2 ** 30,
      estimatedGiB: gpt2StepPeakBytes(GPT2_124M, {
        batch,
        context,
        amp: m.amp,
        checkpoint: m.checkpoint,
        training: true,
        sampleLength: 1,
      }) / 2 ** 30,
    });
    // Printed at once: the process may be stopped before lavapipe has run the recorded steps.
    console.error(
      `gpt2_memory ${m.mode}: ${peakBytes} bytes (${(peakBytes / 2 ** 30).toFixed(3)} GiB)`,
    );
    disposeAll(loss, x, trainer, optimizer, model);
  }
  return results;
}
