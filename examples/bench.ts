/**
 * Benchmarks: one JSON object per line on stdout, a readable table on
 * stderr. `deno task bench` runs every entry; `deno task bench mlp` runs one.
 * On a GPU machine with nothing but the deno binary and a driver (no npm
 * packages, no network):
 *
 *     deno run -A --v8-flags=--expose-gc examples/bench.ts gpt ops matmul tilings --size real
 *
 * Nothing this file imports may reach an npm package or a remote module
 * (Deno would install the lock file's packages before running anything):
 * tests/examples/bench_offline_test.ts runs it with `--no-npm --no-remote`.
 *
 * Entries:
 * - `matmul`: GFLOP/s in f32 and f16 of square products (512³ and 4096³), the
 *   MNIST MLP's first layer and the GPT's linear layers in the three
 *   orientations a linear layer uses (x·Wᵀ, g·W, gᵀ·x);
 * - `mlp`: the 784-256-256-10 MLP, batch 128, fused Adam: steps/s and peak
 *   GPU memory in f32, AMP, AMP bf16 and AMP + checkpointing, and AMP's ms/step with a
 *   `NumericsInspector` attached against without (`amp inspect`);
 * - `checkpoint`: a 32-block MLP where activations dominate: activation
 *   memory and step time with √n segments and with a memory budget;
 * - `tiny_gpt`: the example's transformer in f32, AMP and AMP + checkpointing,
 *   and with a `NumericsInspector` attached (`amp inspect`);
 * - `gpt`: a GPT at real size (nanoGPT's shakespeare-char model) in f32, AMP,
 *   AMP bf16 and AMP + checkpointing, with the profiler's top kernels and the
 *   start-up tuning's picks;
 * - `ops`: each op of that GPT's forward and backward at its shapes, f32 and
 *   f16: GPU ms, TFLOP/s or GB/s, and JavaScript µs per op recorded;
 * - `cnn`: the MNIST CNN in f32, AMP, AMP bf16 and AMP + checkpointing, and conv2d
 *   GFLOP/s at ResNet-like shapes (forward, and forward + backward);
 * - `soak`: 20 × --steps AMP steps: GPU bytes and JS heap after warm-up and
 *   at the end;
 * - `gpt2`: sampling GPT-2 (random weights) token by token with the KV cache
 *   and by recomputing the context: ms per token at several positions;
 * - `gpt2_memory`: one training step of GPT-2 124M at batch 8 × 512 in f32,
 *   AMP, AMP + checkpointing, bf16 + checkpointing and with the unfused head:
 *   peak bytes (named only: minutes a step on a CPU adapter);
 * - `optimizer`: the fused AdamW update alone over GPT-2 124M's tensors with
 *   f32, 8-bit and bf16 moments, interleaved: ms per update and the ratio to
 *   f32's (examples/bench/optimizer.ts). Runs only when named.
 * - `tilings`: every matmul tiling the tuner tries on this adapter (and f16
 *   with chunked sums on the GPU tiling), timed on a big square and the
 *   GPT's fc1 layer in its three orientations; `*` marks the tuner's pick.
 *   Not part of the default run (it is long on CPU adapters).
 * - `host`: the host's milliseconds to record one training step, uncaptured
 *   and captured, of the MNIST MLP and CNN, the tiny GPT, the nanoGPT-size
 *   GPT and GPT-2 124M in f32, AMP and AMP + checkpointing, on Dawn's null
 *   backend (nothing computes), with PyTorch eager's on its meta device
 *   beside them (examples/bench/host.ts). Runs alone, only when named.
 *
 * Synthetic data, so it runs anywhere. `--markdown` prints the figures as a
 * Markdown table to paste into a README or an issue. `--size small` (the default on CPU
 * adapters) shrinks the real-size entries so they finish there. Each entry
 * ends with a "wall time" line.
 *
 * NOTE (how long `--size real` runs on an H100, estimated from the
 * 2026-11-22 figures in shared/perf — GPT step 340–400 ms, ops 0.1–2.5 ms,
 * 4096³ at ≥ 10 TF, any wait ~11 ms — and an assumed ≤ 0.3 s per pipeline
 * compile; every loop is bounded by --steps and --repeats): start-up tuning
 * 20–60 s (18 classes × 7 candidates, and 2 attention dtypes × up to 17
 * plans at the GPT's B·H = 384, T = 256 (about 1 ms a run), each a warm-up
 * and 3 timed runs, the 3 finalists twice, ~150 pipelines); `gpt`
 * 4 modes × (1 + 10 + 1) steps ≈ 20 s plus compiles; `ops` 2 dtypes × 15 ops
 * × ~50 runs ≈ 30 s; `matmul` 24 products, ≤ 11 runs each, ≈ 10 s;
 * `tilings` 2 dtypes × 7 products × 7 candidates, plus chunked f16 sums and
 * unsplit weight gradients, ≈ 110 timings of ≤ 4 runs at ≤ 0.1 s each plus
 * their compiles ≈ 1 min. Each well under 5 minutes. Per-shape tuning (every
 * entry's warm-up tunes the shapes it ran, `gpt` after each mode's first
 * step): ≤ 15 shapes × 14 timings × ~25 ms ≈ 5 s per dtype plus new
 * pipelines, and one attention shape per dtype × up to 20 timings (17 plans,
 * 3 finalists again) of ≥ 0.1 s ≈ 2–4 s, once per adapter; `matmul`'s 24
 * and `ops`' ~30 shapes ≈ 10–15 s more each, once per adapter.
 *
 * @module
 */
import { type Gpu, initGpu } from "../mod.ts";
import { tilingNames } from "../gpu/mod.ts";
import { type BenchOptions, type BenchSize, cpuName, type Result } from "./bench/harness.ts";
import { orExit, parseFlags } from "./cli/flags.ts";
import {
  holdTuningForBench,
  tuneForBench,
  type TuningReport,
  tuningTable,
} from "./bench/tuning.ts";
import { benchCnn } from "./bench/cnn.ts";
import { benchGpt } from "./bench/gpt.ts";
import { benchGpt2, benchGpt2Memory } from "./bench/gpt2.ts";
import { benchMatmul } from "./bench/matmul.ts";
import { benchOps } from "./bench/ops.ts";
import { benchTilings } from "./bench/tilings.ts";
import { benchCheckpoint, benchMlp, benchSoak, benchTinyGpt } from "./bench/training.ts";
import { backendFlag, backendHelp, backendNote } from "./cli/backend_flag.ts";
import { benchHost } from "./bench/host.ts";
import { benchOptimizer } from "./bench/optimizer.ts";

const HELP = `Usage: deno run -A --v8-flags=--expose-gc examples/bench.ts [ENTRY...] [OPTIONS]
       (or deno task bench [ENTRY...] [OPTIONS])

Entries: matmul, mlp, checkpoint, tiny_gpt, gpt, ops, cnn, soak, gpt2 (default: all of these), and,
asked for by name, tilings (every matmul tiling candidate), gpt2_memory (a GPT-2 124M step),
optimizer (the AdamW update with f32, 8-bit and bf16 moments, interleaved) and host (alone: the host's milliseconds per step, uncaptured and captured, on Dawn's null backend,
beside PyTorch eager's on its meta device where python3 has torch). Output: one JSON object per line on stdout; a
table on stderr. Needs no npm package and no network.
  --steps N     timed MLP training steps; other entries scale it to their cost (default 100)
  --repeats N   timed runs per kernel or op (default 10)
  --markdown    print a Markdown table of the figures (with the machine) instead of JSON lines
  --size S      real: the GPT and matmuls at the size of the H100 figures; small: a GPT and
                matmuls that finish in seconds on a CPU adapter; auto (default): real on GPUs,
                small on CPU adapters
  --retune      measure the matmul tilings and attention plans again instead of reading the
                tuners' per-adapter cache (so the tuning report has their times)
${backendHelp(16, "B")}
                (offline: HALFSTEP_DAWN_NODE=/path/dawn.node)
  -h, --help    show this help`;

const ENTRIES: Record<string, (gpu: Gpu, o: BenchOptions) => Promise<Result[]>> = {
  matmul: benchMatmul,
  mlp: (gpu, o) => benchMlp(gpu, o.steps),
  checkpoint: (gpu, o) => benchCheckpoint(gpu, o.steps),
  tiny_gpt: (gpu, o) => benchTinyGpt(gpu, o.steps),
  gpt: benchGpt,
  ops: benchOps,
  cnn: benchCnn,
  soak: (gpu, o) => benchSoak(gpu, o.steps),
  gpt2: benchGpt2,
};

/** Entries run only when named. */
const NAMED_ONLY: Record<string, (gpu: Gpu, o: BenchOptions) => Promise<Result[]>> = {
  tilings: benchTilings,
  gpt2_memory: benchGpt2Memory,
  optimizer: benchOptimizer,
  host: (gpu, o) => benchHost(gpu, Math.min(o.steps, 15)),
};

/** What `host` reports for tuning: nothing (its device never computes, so it tunes nothing). */
const NO_TUNING: TuningReport = {
  seconds: 0,
  matmul: [],
  attention: [],
  retune: false,
  shapeSeconds: 0,
};

/** The headline figure of a result, for the table on stderr. */
function figureOf(result: Result): string {
  const n = (key: string) => result[key] as number;
  if ("hostMsMin" in result) {
    const ratio = result.ratioToTorch === null ? "" : ` ×${n("ratioToTorch").toFixed(2)} torch`;
    const count = result.dispatchesPerStep === null ? "" : ` (${n("dispatchesPerStep")})`;
    return result.hostMsMin === null
      ? String(result.error).slice(0, 40)
      : `${n("hostMsMin").toFixed(2)} ms${count}${ratio}`;
  }
  if ("fwdBwdGflops" in result) {
    return `${n("gflops").toFixed(2)} fwd, ${n("fwdBwdGflops").toFixed(2)} fwd+bwd GFLOP/s`;
  }
  if ("gflops" in result) return `${n("gflops").toFixed(2)} GFLOP/s`;
  if ("fwdMs" in result) {
    const rate = "fwd_tflops" in result
      ? `${n("fwd_tflops").toFixed(2)} TF`
      : `${n("fwd_gbPerSec").toFixed(1)} GB/s`;
    return `${n("fwdMs").toFixed(3)}+${n("bwdMs").toFixed(3)} ms ${rate} ${
      n("jsUsPerOp").toFixed(0)
    } µs JS`;
  }
  if ("ratioToF32" in result) {
    return `${n("msPerUpdate").toFixed(2)} ms/update ×${n("ratioToF32").toFixed(2)} f32`;
  }
  if ("speedup" in result) return `×${n("speedup").toFixed(2)} speed`;
  if ("wallOverGpu" in result) {
    return `×${n("capturedSpeedup").toFixed(2)} speed, wall/GPU ${n("wallOverGpu").toFixed(2)}`;
  }
  if ("inspectOverhead" in result) {
    return `${n("msPerStep").toFixed(1)} vs ${n("msPerStepDetached").toFixed(1)} ms/step ×${
      n("inspectOverhead").toFixed(2)
    }`;
  }
  if ("ampMemoryRatio" in result) {
    return `mem ×${n("ampMemoryRatio").toFixed(2)} amp, ×${
      n("checkpointMemoryRatio").toFixed(2)
    } ckpt`;
  }
  if ("gpuFlat" in result) {
    const heap = (n("heapBytesAtEnd") - n("heapBytesAfterWarmup")) / 2 ** 20;
    return `GPU ${result.gpuFlat ? "flat" : "GROWS"}, heap ${heap.toFixed(1)} MiB`;
  }
  if ("activationMemoryRatio" in result) {
    return `×${n("activationMemoryRatio").toFixed(2)} mem ×${
      n("stepTimeOverhead").toFixed(2)
    } time`;
  }
  if ("msPerToken" in result) return `${n("msPerToken").toFixed(1)} ms/token at ${n("position")}`;
  if ("peakGiB" in result) {
    return `${n("peakGiB").toFixed(2)} GiB (estimated ${n("estimatedGiB").toFixed(2)})`;
  }
  if ("wallSeconds" in result) return `${n("wallSeconds").toFixed(1)} s`;
  if ("tuningSeconds" in result) {
    return `${(result.matmul as unknown[]).length} matmul classes, ${
      (result.attention as unknown[]).length
    } attention dtypes`;
  }
  if ("msPerStep" in result && "tflops" in result) {
    return `${n("msPerStep").toFixed(1)} ms/step ${n("tflops").toFixed(3)} TF`;
  }
  return `${n("stepsPerSec").toFixed(1)} steps/s`;
}

/**
 * Limits Deno's WebGPU to the native backends unless the caller chose: its
 * OpenGL backend loads libEGL, whose teardown can crash the process at exit
 * on Linux (README, Troubleshooting), as `deno task` sets it. Deno reads the
 * variable when the first adapter is requested, so setting it here works.
 */
function nativeBackendsOnly(): void {
  const name = "DENO_WEBGPU_BACKEND";
  if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") return;
  if (Deno.env.get(name) === undefined) Deno.env.set(name, "vulkan,metal,dx12");
}

/** The command line, or one line on stderr and exit status 2. */
function parse() {
  try {
    return parseFlags({
      args: Deno.args,
      allowPositionals: true,
      options: {
        steps: { type: "string", default: "100" },
        repeats: { type: "string", default: "10" },
        size: { type: "string", default: "auto" },
        markdown: { type: "boolean", default: false },
        retune: { type: "boolean", default: false },
        backend: { type: "string" },
        help: { type: "boolean", short: "h", default: false },
      },
    });
  } catch (e) {
    console.error(`bench: ${(e as Error).message} (see --help)`);
    Deno.exit(2);
  }
}

async function main(): Promise<void> {
  const { values, positionals } = parse();
  if (values.help) return console.log(HELP);
  // `host` runs alone, on Dawn's null backend (a device that never computes).
  const host = positionals.includes("host");
  if (host && (positionals.length > 1 || values.backend !== undefined)) {
    console.error("bench: host runs alone, on Dawn's null backend: bench host [--steps N]");
    Deno.exit(2);
  }
  const unknown = positionals.filter((p) => !(p in ENTRIES) && !(p in NAMED_ONLY));
  if (unknown.length > 0) {
    console.error(
      `bench: unknown entry ${unknown.join(", ")}; entries: ${
        [...Object.keys(ENTRIES), ...Object.keys(NAMED_ONLY)].join(", ")
      }`,
    );
    Deno.exit(2);
  }
  const steps = Number(values.steps), repeats = Number(values.repeats);
  const size = values.size as BenchSize;
  if (!(Number.isInteger(steps) && steps >= 1) || !(Number.isInteger(repeats) && repeats >= 1)) {
    console.error("bench: --steps and --repeats must be positive integers");
    Deno.exit(2);
  }
  if (!["auto", "real", "small"].includes(size)) {
    console.error(`bench: --size must be auto, real or small, not "${size}"`);
    Deno.exit(2);
  }
  const backend = orExit("bench", () => backendFlag(values.backend));
  nativeBackendsOnly();
  // Lazy tuning notes what each entry runs; each warm-up tunes it, before the entry times.
  const gpu = host
    ? await initGpu({ backend: "dawn-null", tuning: "off", matmulTiling: "default" })
    : await initGpu({ tuning: "lazy", backend });
  console.error(`adapter: ${gpu.adapterName}${backendNote(gpu)}`);
  if (!host) holdTuningForBench(gpu);
  // The tuners run here too, to report every class's and dtype's pick with its time.
  const tuning = host ? NO_TUNING : await tuneForBench(gpu, values.retune);
  if (!host) console.error(tuningTable(tuning));
  const options: BenchOptions = { steps, repeats, size, tuning };
  const cpu = await cpuName();
  const context = {
    adapter: gpu.adapterName,
    backend: gpu.backend,
    subgroupMatrixConfigs: gpu.subgroupMatrixConfigs,
    cpu,
    deno: Deno.version.deno,
    f16: gpu.f16,
    matmulTilings: tilingNames(gpu),
  };
  const rows: string[] = [];
  for (const name of positionals.length > 0 ? positionals : Object.keys(ENTRIES)) {
    const start = performance.now();
    const results = await (ENTRIES[name] ?? NAMED_ONLY[name])(gpu, options);
    results.push({
      bench: name,
      mode: "wall time",
      shape: "the whole entry",
      wallSeconds: (performance.now() - start) / 1000,
      peakBytes: 0,
    });
    for (const result of results) {
      if (!values.markdown) console.log(JSON.stringify({ ...result, ...context }));
      const shape = (result.op ?? result.shape ?? result.model) as string;
      // Rows that allocate nothing of their own (wall time, tuning) show no peak.
      const peak = result.peakBytes > 0 ? `${(result.peakBytes / 2 ** 20).toFixed(2)} MiB` : "";
      rows.push(`| ${result.bench} | ${result.mode} | ${shape} | ${figureOf(result)} | ${peak} |`);
      console.error(
        `${result.bench.padEnd(8)} ${result.mode.padEnd(8)} ${shape.slice(0, 56).padEnd(56)} ${
          figureOf(result).padStart(24)
        }${peak && `  peak ${peak}`}`,
      );
    }
  }
  if (values.markdown) {
    console.log(
      [
        `Measured on ${gpu.adapterName}${backendNote(gpu)}${
          cpu ? ` (CPU: ${cpu})` : ""
        }, Deno ${Deno.version.deno}, ` +
        `${new Date().toISOString().slice(0, 10)}:`,
        "",
        "| bench | mode | shape | figure | peak memory |",
        "| --- | --- | --- | --- | --- |",
        ...rows,
      ].join("\n"),
    );
  }
  gpu.destroy();
}

if (import.meta.main) await main();
