/**
 * Fine-tunes GPT-2 (Hugging Face's published model.safetensors) on a text
 * file and samples from it, with AdamW through `AmpTrainer`: `--amp`,
 * `--amp bf16`, `--checkpoint`, `--accum`, a warmup + cosine schedule,
 * validation loss, `--save` / `--resume`, and a KV cache for sampling. The
 * head and its cross-entropy run in chunks of rows (`linearCrossEntropy`), so
 * the logits [B·T, 50257] are never whole. See docs/gpt2.md.
 *
 *     deno run -A examples/gpt2.ts --weights model.safetensors --data my.txt --amp
 *     deno run -A examples/gpt2.ts --weights model.safetensors --prompt "Hello" --temperature 0
 *
 * Run with `--help` for every flag. Training waits for the GPU only to log
 * (every `--log-every` steps), to validate and to save.
 *
 * @module
 */
import { dirname, join } from "node:path";
import { initGpu, type SafetensorsEntry } from "../mod.ts";
import { loadSafetensors } from "../files.ts";
import { orExit, orExitAsync, reason, runMain, UsageError } from "./cli/flags.ts";
import { checkPlan, runLimits } from "./cli/preflight.ts";
import { checkResumeFlags } from "./cli/resume_flags.ts";
import { backendNote } from "./cli/backend_flag.ts";
import { readRecordOrExit, saveOutput } from "./runs/run_file.ts";
import {
  checkOutputsReplace,
  checkOutputsWritable,
  type InputFile,
  type OutputFile,
} from "./runs/outputs.ts";
import { SaveLock } from "./runs/save_lock.ts";
import { precisionDetail } from "./cli/amp_flag.ts";
import { GPT2_HELP, GPT2_SIZES, type Gpt2Args, parseGpt2Args } from "./gpt2/args.ts";
import { loadTextTokens } from "./data/gpt2_tokens.ts";
import { generate } from "../models/mod.ts";
import { gpt2Buffers, gpt2Parameters } from "./gpt2/memory.ts";
import { type Emit, fineTune, GPT2_RUN, runFlags, type Trained } from "./gpt2/run.ts";
import { decodeGpt2, encodeGpt2 } from "../models/mod.ts";
import {
  configBeside,
  GPT2_124M,
  type Gpt2Checkpoint,
  gpt2Checkpoint,
  gpt2Config,
  gpt2FromEntries,
  type Gpt2Sizes,
  headsOf,
  initGpt2,
} from "../models/mod.ts";
import { Gpt } from "../models/mod.ts";

/** The published sizes by --random's names. */
const RANDOM_SIZES: Record<string, Gpt2Sizes> = {
  "124M": GPT2_124M,
  "355M": { ...GPT2_124M, layers: 24, dim: 1024, heads: 16 },
  "774M": { ...GPT2_124M, layers: 36, dim: 1280, heads: 20 },
  "1.5B": { ...GPT2_124M, layers: 48, dim: 1600, heads: 25 },
};

/**
 * The flags, or null after --help; a bad flag, or an output path that
 * cannot be written, is one line and exit status 2.
 */
async function parseFlags(args: string[]): Promise<Gpt2Args | null> {
  const cfg = orExit("gpt2", () => {
    try {
      return parseGpt2Args(args);
    } catch (e) {
      if (e instanceof UsageError) throw new UsageError(`${e.message} (see --help)`);
      throw e;
    }
  });
  if (cfg === null) {
    console.log(GPT2_HELP.trimEnd());
    return null;
  }
  await orExitAsync("gpt2", () => checkOutputsWritable(gpt2Files(cfg).outputs));
  return cfg;
}

/**
 * The files the run writes (--save, --save-weights) and reads (--weights,
 * the config.json beside it, --data, --resume), for the one output rule
 * (examples/runs/outputs.ts).
 */
function gpt2Files(cfg: Gpt2Args): { outputs: OutputFile[]; inputs: InputFile[] } {
  const outputs: OutputFile[] = [];
  if (cfg.save) outputs.push(saveOutput({ save: cfg.save, resume: cfg.resume }, GPT2_RUN));
  if (cfg.saveWeights) outputs.push({ flag: "save-weights", path: cfg.saveWeights });
  const inputs: InputFile[] = [];
  if (cfg.weights) {
    inputs.push({ flag: "weights", path: cfg.weights });
    inputs.push({ flag: "weights", path: join(dirname(cfg.weights), "config.json") });
  }
  if (cfg.data) inputs.push({ flag: "data", path: cfg.data });
  if (cfg.resume) inputs.push({ flag: "resume", path: cfg.resume });
  return { outputs, inputs };
}

/**
 * --weights read and checked as GPT-2's, with the config.json beside it
 * (null for --random): exit status 1 when the file cannot be read, 2 when
 * it is not GPT-2's.
 */
async function readWeights(
  cfg: Gpt2Args,
): Promise<{ checkpoint: Gpt2Checkpoint; bytes: number } | null> {
  if (!cfg.weights) return null;
  const path = cfg.weights;
  let entries: Map<string, SafetensorsEntry>, metadata: Record<string, string>;
  try {
    ({ entries, metadata } = await loadSafetensors(path));
  } catch (e) {
    console.error(`gpt2: --weights ${path}: ${reason(e)}`);
    Deno.exit(1);
  }
  const bytes = [...entries.values()].reduce((n, e) => n + e.data.byteLength, 0);
  const json = await configBeside(path).catch((e) =>
    orExit("gpt2", () => {
      throw new UsageError(`--weights ${path}: ${reason(e)}`);
    })
  );
  const checkpoint = orExit("gpt2", () => {
    try {
      return gpt2Checkpoint(entries, { json, heads: cfg.heads, savedHeads: headsOf(metadata) });
    } catch (e) {
      throw new UsageError(`--weights ${path}: ${reason(e)}`);
    }
  });
  return { checkpoint, bytes };
}

/** The model: the checked file's weights, or a random GPT-2 of --random's size. */
function buildModel(
  cfg: Gpt2Args,
  checkpoint: Gpt2Checkpoint | null,
  maxBufferBytes: number,
): Gpt {
  if (checkpoint) return gpt2FromEntries(checkpoint, { seed: cfg.seed, maxBufferBytes });
  const model = new Gpt(gpt2Config(RANDOM_SIZES[cfg.random!], cfg.seed, maxBufferBytes));
  initGpt2(model, cfg.seed);
  return model;
}

/**
 * The tokens of --prompt; a UsageError when it is empty, or when it and
 * --max-new-tokens need more positions than the model's `context`.
 */
function promptTokens(text: string, maxNewTokens: number, context: number): number[] {
  const prompt = encodeGpt2(text);
  if (prompt.length === 0) throw new UsageError("--prompt is empty.");
  if (prompt.length + maxNewTokens > context) {
    throw new UsageError(
      `--prompt is ${prompt.length} tokens; with --max-new-tokens ${maxNewTokens} that makes ` +
        `${prompt.length + maxNewTokens} positions, more than the model's ${context} positions: ` +
        "shorten the prompt or lower --max-new-tokens (--context sizes training windows only).",
    );
  }
  return prompt;
}

/** --prompt: samples --max-new-tokens tokens after `prompt` with the KV cache and prints them. */
async function sample(cfg: Gpt2Args, emit: Emit, model: Gpt, prompt: number[]): Promise<void> {
  emit(
    "phase",
    { phase: "sample", tokens: cfg.maxNewTokens },
    `sampling ${cfg.maxNewTokens} tokens after the prompt's ${prompt.length} (the first ` +
      "compiles the kernels)...",
  );
  const started = performance.now();
  const [ids] = await generate(model, [prompt], {
    maxNewTokens: cfg.maxNewTokens,
    temperature: cfg.temperature,
    topK: cfg.topK === 0 ? undefined : cfg.topK,
    seed: cfg.seed,
  });
  const seconds = (performance.now() - started) / 1000;
  const text = decodeGpt2(ids);
  emit(
    "sample",
    { prompt: cfg.prompt, promptIds: prompt, ids, text, secondsPerToken: seconds / ids.length },
    `${cfg.prompt}${text}\n(${ids.length} tokens, ${(seconds / ids.length).toFixed(3)} s/token)`,
  );
}

/** The start line: the adapter, the model and, when training, the text and the run's settings. */
function startText(cfg: Gpt2Args, adapter: string, sizes: Gpt2Sizes, tokens: number[]): string {
  const model = `adapter: ${adapter}; GPT-2 ${sizes.layers} layers, width ${sizes.dim}, ` +
    `${sizes.heads} heads, ${(gpt2Parameters(sizes) / 1e6).toFixed(1)}M parameters (${
      cfg.weights ?? `random ${cfg.random}`
    })`;
  if (!cfg.data) return model;
  const precision = precisionDetail(cfg.amp, cfg.ampDtype) +
    (cfg.checkpoint ? ", checkpointed blocks" : "");
  return `${model}\ntext: ${tokens[0]} training and ${tokens[1]} held-out tokens; ${precision}; ` +
    `AdamW lr ${cfg.lr}, batch ${cfg.batch}×${cfg.accum} of ${cfg.context} tokens, ` +
    `${cfg.steps} steps`;
}

/** The final line: the validation losses, the time per step and the peak (a finished run: no "NaN"). */
function finalText(
  result: { before: number; trained: Trained | null; peakBytes: number } | null,
  wallSeconds: number,
): string {
  const wall = `wall ${wallSeconds.toFixed(1)} s`;
  if (!result) return wall;
  const peak = `peak GPU memory ${(result.peakBytes / 2 ** 30).toFixed(2)} GiB`;
  const { before, trained } = result;
  if (!trained) {
    return `validation loss ${before.toFixed(4)} (nothing left to train); ${peak}; ${wall}`;
  }
  return `validation loss ${before.toFixed(4)} → ${trained.validation.toFixed(4)}; ` +
    `${trained.secondsPerStep.toFixed(2)} s/step; ${peak}; ${wall}`;
}

async function main(): Promise<void> {
  const started = performance.now();
  const cfg = await parseFlags(Deno.args);
  if (cfg === null) return;
  const emit: Emit = (event, fields, text) =>
    console.log(cfg.json ? JSON.stringify({ event, ...fields }) : text);
  // A --resume file that cannot continue here, or other flags, are refused before start-up.
  const record = await readRecordOrExit("gpt2", cfg.resume, GPT2_RUN);
  const changes = record
    ? orExit("gpt2", () => {
      if (cfg.steps < record.step) {
        throw new UsageError(
          `--steps ${cfg.steps}: ${cfg.resume} is already at step ${record.step}; give --steps ` +
            `${record.step} (its end) or more (to extend it).`,
        );
      }
      return checkResumeFlags(cfg.resume!, record.flags, runFlags(cfg), cfg.override);
    })
    : [];
  // The lock first: a run in use says so, not that its file holds a run.
  const lock = cfg.save
    ? await orExitAsync(
      "gpt2",
      () => SaveLock.acquire(cfg.save!, "save", (t) => console.error(`gpt2: ${t}`)),
    )
    : null;
  await orExitAsync("gpt2", () => {
    const { outputs, inputs } = gpt2Files(cfg);
    return checkOutputsReplace(outputs, { inputs, overwrite: cfg.overwrite });
  });
  const data = cfg.data ? await orExitAsync("gpt2", () => loadTextTokens(cfg.data!, cfg)) : null;
  const weights = await readWeights(cfg);
  const sizes = weights?.checkpoint.sizes ?? RANDOM_SIZES[cfg.random!];
  if (data && cfg.context > sizes.context) {
    orExit("gpt2", () => {
      throw new UsageError(
        `--context ${cfg.context} is longer than the model's ${sizes.context} positions.`,
      );
    });
  }
  const prompt = cfg.prompt === undefined
    ? null
    : orExit("gpt2", () => promptTokens(cfg.prompt!, cfg.maxNewTokens, sizes.context));
  const gpu = await initGpu({ backend: cfg.backend });
  // The sizes, checked against this adapter and host before any GPU allocation of the model.
  const limits = runLimits(gpu);
  const tokens = data ? [data.train.length, data.validation.length] : [0, 0];
  const plan = gpt2Buffers(
    sizes,
    { ...cfg, training: data !== null, sampleLength: (prompt?.length ?? 0) + cfg.maxNewTokens },
    {
      fileBytes: weights?.bytes ?? 0,
      tokens: tokens[0] + tokens[1],
      cpuAdapter: gpu.adapterProfile.cpu,
      maxBufferBytes: limits.bufferBytes,
    },
  );
  orExit("gpt2", () => checkPlan(plan, limits, GPT2_SIZES));
  const model = buildModel(cfg, weights?.checkpoint ?? null, limits.bufferBytes);
  weights?.checkpoint.tensors.clear(); // the host copy is no longer needed
  if (cfg.checkpoint) model.blocks.checkpoint = sizes.layers;
  emit(
    "start",
    {
      adapter: gpu.adapterName,
      model: sizes,
      parameters: gpt2Parameters(sizes),
      ...cfg,
      backend: gpu.backend,
      tokens: tokens[0] + tokens[1],
    },
    startText(cfg, `${gpu.adapterName}${backendNote(gpu)}`, sizes, tokens),
  );
  const result = data
    ? {
      ...(await fineTune({ cfg, emit, gpu, data, model, lock }, record, changes)),
      peakBytes: gpu.memoryStats().peakBytes,
    }
    : null;
  if (prompt) await sample(cfg, emit, model, prompt);
  const wallSeconds = (performance.now() - started) / 1000;
  const trained = result?.trained;
  emit(
    "final",
    result
      ? {
        before: result.before,
        loss: trained?.loss ?? null,
        validation: trained?.validation ?? result.before,
        secondsPerStep: trained?.secondsPerStep ?? null,
        ...trained?.capture,
        peakBytes: result.peakBytes,
        wallSeconds,
      }
      : { wallSeconds },
    finalText(result, wallSeconds),
  );
  model.dispose();
  gpu.destroy();
  lock?.release();
}

if (import.meta.main) await runMain("gpt2", main);
