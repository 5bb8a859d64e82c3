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
 *   estimate beside it, each mode in a process of its own that exits once
 *   its step is recorded (see gpt2_memory_step.ts). The peak does not depend
 *   on the adapter. `--size small` runs batch 2 × 128.
 *
 * @module
 */
import { type Gpu, noGrad, RandomGenerator, Tensor, tidy } from "../../mod.ts";
import { type BenchOptions, resolveSize, type Result, warmUp } from "./harness.ts";
import { KvCache } from "../../models/sampling.ts";
import { bufferLimit, GPT2_MEMORY_MODES } from "../gpt2/memory_step.ts";
import { GPT2_124M, gpt2Config, type Gpt2Sizes } from "../../models/gpt2.ts";
import { Gpt } from "../../models/gpt.ts";

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
  const model = new Gpt(gpt2Config(sizes, 1, bufferLimit(gpu)));
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

/**
 * One training step of GPT-2 124M per mode: its peak bytes. Each mode runs in
 * a process of its own (examples/gpt2_memory_step.ts) that exits once its
 * step is recorded, so no mode waits for the adapter to run another's step
 * (tens of minutes on a CPU adapter).
 */
export async function benchGpt2Memory(gpu: Gpu, o: BenchOptions): Promise<Result[]> {
  const real = resolveSize(gpu, o.size) === "real";
  const batch = real ? 8 : 2, context = real ? 512 : 128;
  const results: Result[] = [];
  for (const m of GPT2_MEMORY_MODES) {
    if (!m.fused && 4 * batch * context * 50257 > bufferLimit(gpu)) continue; // the logits would not fit
    const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        new URL("../gpt2_memory_step.ts", import.meta.url).pathname,
        `--mode=${m.mode}`,
        `--batch=${batch}`,
        `--context=${context}`,
        `--backend=${gpu.backend}`,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (code !== 0) {
      throw new Error(`gpt2_memory ${m.mode}: ${new TextDecoder().decode(stderr).trim()}`);
    }
    const result = JSON.parse(new TextDecoder().decode(stdout).trim().split("\n").at(-1)!);
    results.push(result as Result);
  }
  return results;
}
