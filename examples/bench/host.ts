/**
 * `bench host`: what the host costs per training step, measured where
 * nothing else is in the way. On Dawn's null backend every command is
 * validated and recorded and none executes, and submits are held back until
 * the step is recorded, so a step's wall time is JavaScript's work and
 * Dawn's encoding alone — the floor a GPU step can never beat, whatever the
 * GPU. For each model (the MNIST MLP and CNN, the tiny GPT, the nanoGPT-size
 * GPT, GPT-2 124M) and mode (f32, AMP, AMP with checkpointing) it times an
 * uncaptured step (`trainer.step`) and a captured one (`step.run`, replayed)
 * in turns, and, where a Python with torch is found, a step of the same
 * model in PyTorch eager on its `meta` device (the dispatcher, autograd,
 * clipping and AdamW; no kernel), driven step by step over a pipe so the
 * three interleave and share the machine's load.
 *
 * Batch and context shrink what would be computed, never what is recorded
 * (the same dispatches whatever the sizes), so the GPTs run short batches.
 */
import {
  AdamW,
  AmpTrainer,
  crossEntropy,
  type Gpu,
  type Module,
  RandomGenerator,
  Tensor,
} from "../../mod.ts";
import { setDefaultGpu } from "../../gpu/mod.ts";
import type { Result } from "./harness.ts";
import { mnistCnn, mnistMlp } from "../mnist/model.ts";
import { Gpt } from "../../models/gpt.ts";
import { GPT2_124M, gpt2Config } from "../../models/gpt2.ts";
import { findTorchPython } from "../cli/torch_python.ts";

/** A model `bench host` times. */
interface HostModel {
  /** The name PyTorch's script knows it by. */
  name: "mlp" | "cnn" | "tiny_gpt" | "nanogpt" | "gpt2";
  /** What it is, for the row. */
  model: string;
  make(): Module;
  /** Its input batch and targets. */
  batch(model: Module): [Tensor, Tensor];
  loss(model: Module, x: Tensor, y: Tensor): Tensor;
  /** Turns checkpointing on or off. */
  checkpoint(model: Module, on: boolean): void;
}

const ids = (shape: number[], vocab: number) =>
  Tensor.from(Array.from({ length: shape.reduce((a, b) => a * b) }, (_, i) => i % vocab), shape, {
    dtype: "i32",
  });

function classifier(name: "mlp" | "cnn"): HostModel {
  const input = name === "mlp" ? [128, 784] : [128, 1, 28, 28];
  return {
    name,
    model: name === "mlp" ? "MNIST MLP 784-256-256-10, batch 128" : "MNIST CNN, batch 128",
    make: () => name === "mlp" ? mnistMlp(1) : mnistCnn(1),
    batch: () => [
      Tensor.from(new RandomGenerator(1).uniform(input.reduce((a, b) => a * b)), input),
      ids([128], 10),
    ],
    loss: (m, x, y) => crossEntropy(m.forward(x), y),
    checkpoint: (
      m,
      on,
    ) => (((m as unknown as { checkpoint: unknown }).checkpoint) = on ? "auto" : null),
  };
}

function gpt(
  name: "tiny_gpt" | "nanogpt" | "gpt2",
  model: string,
  make: () => Gpt,
  batch: number,
): HostModel {
  return {
    name,
    model,
    make,
    batch(m) {
      const { context, vocab } = (m as Gpt).config;
      return [ids([batch, context], vocab), ids([batch * context], vocab)];
    },
    loss: (m, x, y) => (m as Gpt).loss(x, y),
    checkpoint: (
      m,
      on,
    ) => ((m as Gpt).blocks.checkpoint = on ? (m as Gpt).config.layers : null),
  };
}

/** The models, as PyTorch's script builds them too (examples/bench/host_torch.py). */
function hostModels(): HostModel[] {
  return [
    classifier("mlp"),
    classifier("cnn"),
    gpt(
      "tiny_gpt",
      "tiny GPT (2 layers, dim 64, context 32), batch 32",
      () => new Gpt({ vocab: 28, context: 32, layers: 2, dim: 64, heads: 4, seed: 1 }),
      32,
    ),
    gpt(
      "nanogpt",
      "nanoGPT-size GPT (6 layers, dim 384, context 256), batch 2",
      () => new Gpt({ vocab: 65, context: 256, layers: 6, dim: 384, heads: 6, seed: 1 }),
      2,
    ),
    // NOTE: Dawn's null backend holds at most 512 MiB, under 124M parameters with AdamW's state:
    // the 124M's layers, heads, vocabulary and tied two-piece table at width 96 record its
    // dispatches (widths change none).
    gpt(
      "gpt2",
      "GPT-2 124M's layers, heads and tied two-piece table at width 96 (context 256), batch 1",
      () => new Gpt({ ...gpt2Config({ ...GPT2_124M, context: 256, dim: 96 }, 1), tableShards: 2 }),
      1,
    ),
  ];
}

/** PyTorch eager on its meta device, one step per request (examples/bench/host_torch.py). */
class TorchSteps {
  readonly version: string;
  #child: Deno.ChildProcess;
  #writer: WritableStreamDefaultWriter<Uint8Array>;
  #lines: AsyncIterator<string>;

  private constructor(child: Deno.ChildProcess, lines: AsyncIterator<string>, version: string) {
    this.#child = child;
    this.#writer = child.stdin.getWriter();
    this.#lines = lines;
    this.version = version;
  }

  /** The script started on the Python that has torch, or null where there is none. */
  static async start(): Promise<TorchSteps | null> {
    const python = findTorchPython();
    if (!python) return null;
    const script = new URL("./host_torch.py", import.meta.url).pathname;
    const child = new Deno.Command(python, {
      args: ["-W", "ignore", script],
      stdin: "piped",
      stdout: "piped",
      stderr: "null",
    }).spawn();
    const lines = readLines(child.stdout);
    const first = JSON.parse((await lines.next()).value ?? "{}") as { torch?: string };
    return new TorchSteps(child, lines, first.torch ?? "?");
  }

  /** One step of `model` (`ckpt`: with checkpointing): its milliseconds, or why it failed. */
  async step(model: string, ckpt: boolean): Promise<number | string> {
    await this.#writer.write(new TextEncoder().encode(`${model} ${ckpt ? "ckpt" : "f32"}\n`));
    const line = (await this.#lines.next()).value;
    const answer = JSON.parse(line ?? `{"error":"the script ended"}`) as {
      ms?: number;
      error?: string;
    };
    return answer.ms ?? answer.error ?? "no answer";
  }

  async close(): Promise<void> {
    await this.#writer.close();
    await this.#child.status;
  }
}

async function* readLines(stream: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  let text = "";
  for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
    text += chunk;
    let end: number;
    while ((end = text.indexOf("\n")) >= 0) {
      yield text.slice(0, end);
      text = text.slice(end + 1);
    }
  }
}

const MODES = ["f32", "amp", "amp+ckpt"] as const;

/** Steps a captured step may take to be captured (two recorded cycles, a third after a first step). */
const CAPTURE_STEPS = 4;

const minimum = (xs: number[]) => Math.min(...xs);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];

/**
 * The `host` entry: for every model and mode, `rounds` turns of an
 * uncaptured step, a captured step and (where torch is) PyTorch's, each
 * timed alone; rows with the minimum and median milliseconds, dispatches
 * and µs per dispatch, and the ratio to PyTorch's minimum. `gpu` must be on
 * Dawn's null backend (`initGpu({ backend: "dawn-null" })`).
 */
export async function benchHost(gpu: Gpu, rounds: number): Promise<Result[]> {
  setDefaultGpu(gpu);
  // Submits held back: a step's time is what recording it costs (the sync after it submits).
  gpu.batch.flushPolicy = { maxDispatches: Infinity, maxWork: Infinity };
  const torch = await TorchSteps.start();
  if (!torch) console.error("bench host: no Python with torch found; PyTorch's rows are left out");
  const results: Result[] = [];
  const only = Deno.env.get("HALFSTEP_BENCH_HOST_MODELS")?.split(",");
  for (const spec of hostModels().filter((m) => !only || only.includes(m.name))) {
    const model = spec.make();
    const [x, y] = spec.batch(model);
    for (const mode of MODES) {
      spec.checkpoint(model, mode === "amp+ckpt");
      const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
      const trainer = new AmpTrainer(model, optimizer, { enabled: mode !== "f32", maxGradNorm: 1 });
      const step = trainer.capture((a, b) => spec.loss(model, a, b));
      const timed = async (fn: () => Tensor) => {
        const d0 = gpu.batch.counters.dispatches;
        const t0 = performance.now();
        fn().dispose();
        const ms = performance.now() - t0;
        await gpu.sync();
        return { ms, dispatches: gpu.batch.counters.dispatches - d0 };
      };
      const eager = () => trainer.step(() => spec.loss(model, x, y));
      const replayed = () => step.run(x, y);
      for (let i = 0; i < 2; i++) await timed(eager);
      for (let i = 0; i < CAPTURE_STEPS && step.stats.replayed === 0; i++) await timed(replayed);
      for (let i = 0; i < 2 && torch; i++) await torch.step(spec.name, mode === "amp+ckpt");
      const times = { uncaptured: [] as number[], captured: [] as number[], torch: [] as number[] };
      let dispatches = { uncaptured: 0, captured: 0 };
      let torchError: string | null = null;
      for (let r = 0; r < rounds; r++) {
        const u = await timed(eager), c = await timed(replayed);
        times.uncaptured.push(u.ms);
        times.captured.push(c.ms);
        dispatches = { uncaptured: u.dispatches, captured: c.dispatches };
        const t: number | string | null = torch && !torchError
          ? await torch.step(spec.name, mode === "amp+ckpt")
          : null;
        if (typeof t === "number") times.torch.push(t);
        else if (typeof t === "string") torchError = t;
      }
      const torchMin = times.torch.length > 0 ? minimum(times.torch) : null;
      const row = (run: string, ms: number[], count: number | null): Result => ({
        bench: "host",
        mode,
        model: spec.model,
        run,
        hostMsMin: minimum(ms),
        hostMsMedian: median(ms),
        dispatchesPerStep: count,
        usPerDispatch: count ? minimum(ms) * 1000 / count : null,
        ratioToTorch: torchMin ? minimum(ms) / torchMin : null,
        rounds,
        peakBytes: 0,
      });
      if (step.stats.replayed < rounds) {
        console.error(`bench host: ${spec.name} ${mode} did not replay`);
      }
      results.push(
        row("uncaptured", times.uncaptured, dispatches.uncaptured),
        row("captured", times.captured, dispatches.captured),
      );
      if (torch) {
        results.push({
          ...row(
            `PyTorch ${torch.version} eager (meta, f32)`,
            times.torch.length ? times.torch : [NaN],
            null,
          ),
          ...(torchError &&
            { hostMsMin: null, hostMsMedian: null, ratioToTorch: null, error: torchError }),
        });
      }
      trainer.dispose();
      optimizer.dispose();
      await gpu.sync();
      // Each mode starts from what the model holds: Dawn's null backend has a memory budget too.
      gpu.pool.releaseCached();
    }
    for (const t of [x, y, model]) t.dispose();
    await gpu.sync();
    gpu.pool.releaseCached(); // the next model starts from an empty pool
  }
  await torch?.close();
  return results;
}
