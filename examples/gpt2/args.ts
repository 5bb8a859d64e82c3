/**
 * The command line of `gpt2.ts`: its help text and flag parsing.
 *
 * @module
 */
import { ampDtypeFlag, type AmpFlagDtype } from "../cli/amp_flag.ts";
import { backendFlag, backendHelp } from "../cli/backend_flag.ts";
import { captureHelp } from "../cli/capture_flag.ts";
import { optimStatesFlag, optimStatesHelp } from "../cli/optim_states_flag.ts";
import { gradDtypeFlag, gradDtypeHelp } from "../cli/grad_dtype_flag.ts";
import type { Backend, GradDType, StateDtype } from "../../mod.ts";
import {
  choiceFlag,
  integerFlag,
  numberFlag,
  parseFlags,
  UsageError,
  withNegativeValues,
} from "../cli/flags.ts";

/** `gpt2.ts --help`. */
export const GPT2_HELP = `Fine-tune GPT-2 on your own text, and sample from it, on the GPU (WebGPU).

Usage:
  deno run -A examples/gpt2.ts --weights model.safetensors --data my.txt [flags]
  deno run -A examples/gpt2.ts --weights model.safetensors --prompt "Once upon" [flags]

Weights: Hugging Face's model.safetensors of GPT-2 (openai-community/gpt2 and
its larger siblings; F32 or F16; a config.json beside it is read when present).
Data: a UTF-8 text file, tokenized with GPT-2's tokenizer; the first 90% of the
tokens train (windows of --context tokens at random offsets), the rest is held
out and scored (consecutive windows). Losses are nats per token.

Model:
  --weights PATH     GPT-2's model.safetensors (see docs/gpt2.md for where)
  --random SIZE      no weights: a randomly initialised GPT-2 of SIZE (124M,
                     355M, 774M or 1.5B), for trying the memory and speed
  --heads N          attention heads, for a width that is none of the published
                     sizes and has no config.json beside it
Training (with --data):
  --data PATH        the text to fine-tune on
  --steps N          optimizer steps (default 100)
  --batch N          sequences per micro-batch (default 4)
  --accum N          micro-batches per optimizer step (default 1)
  --context N        tokens per sequence (default 256; at most the model's 1024)
  --lr X             peak AdamW learning rate (default 1e-4; weight decay 0.01,
                     gradients clipped to norm 1), linear warmup then cosine
                     decay to lr/10
${optimStatesHelp(21)}
${gradDtypeHelp(21)}
  --warmup N         warmup steps (default 10)
  --amp, --fp16      mixed precision: f16 autocast, fp32 master weights, dynamic
                     loss scaling
  --amp bf16         mixed precision in bf16 (no loss scaling)
  --checkpoint       gradient checkpointing: each block keeps only its input
${captureHelp(21)}
  --validation X     share of the tokens held out (default 0.1)
  --eval-every N     validation loss every N steps, and after the last (default 50)
  --eval-windows N   validation windows of --context tokens scored (default 16)
  --log-every N      read the training loss back every N steps (default 10)
  --seed N           seed of the batches, a random model and the samples (default 0)
  --save PATH        save the whole training run (model, AdamW, scaler, schedule,
                     data order) every --eval-every steps and at the end, atomically;
                     the file is locked (PATH.lock) while this run writes it
  --resume PATH      continue a run saved with --save (same flags; --override
                     lets --lr change; a larger --steps extends a run, finished
                     or not, its schedule going on as the new total says)
  --override         with --resume: train on with a different --lr
  --overwrite        replace the files --save and --save-weights name although
                     they are there (a saved run is replaced at the first good
                     validation); without it such a run is refused before it
                     starts, unless --save is the --resume file; a file the run
                     reads (--weights, --data, --resume) is never replaced
  --save-weights PATH
                     after training, write the model as Hugging Face's
                     model.safetensors (GPT2LMHeadModel's names)
Sampling (after training, if any):
  --prompt TEXT      text to continue
  --max-new-tokens N tokens to add (default 50)
  --temperature X    0 = greedy; else softmax(logits / X) (default 0.8)
  --top-k N          draw among the N most likely tokens (default 40; 0 = all)
Output:
  --json             one JSON object per line; a sample's event holds its "ids"
${backendHelp(21)}
  -h, --help         show this help

Exit status: 0 done; 1 a file could not be read or written, or a --resume
file that cannot continue here; 2 a bad flag, a file that is not GPT-2's, a
--data that is not UTF-8 text, sizes that cannot fit this adapter or host
(checked before the first step), or an output holding a file without --resume
or --overwrite; 3 training diverged (nothing is saved over --save then).
`;

/** The published sizes --random takes. */
export const GPT2_RANDOM_SIZES = ["124M", "355M", "774M", "1.5B"] as const;

/** The parsed flags. */
export interface Gpt2Args {
  weights?: string;
  random?: (typeof GPT2_RANDOM_SIZES)[number];
  heads?: number;
  data?: string;
  steps: number;
  batch: number;
  accum: number;
  context: number;
  lr: number;
  warmup: number;
  amp: boolean;
  ampDtype: AmpFlagDtype;
  checkpoint: boolean;
  /** Capture the training step (not --no-capture). */
  capture: boolean;
  validation: number;
  evalEvery: number;
  evalWindows: number;
  logEvery: number;
  seed: number;
  save?: string;
  resume?: string;
  override: boolean;
  overwrite: boolean;
  saveWeights?: string;
  prompt?: string;
  maxNewTokens: number;
  temperature: number;
  topK: number;
  json: boolean;
  /** The WebGPU backend (--backend); undefined: initGpu's default. */
  backend: Backend | undefined;
  /** How AdamW keeps its moments (--optim-states). */
  optimStates: StateDtype;
  /** What the masters' gradients are kept in (--grad-dtype). */
  gradDtype: GradDType;
}

/** The defaults of the flags that size a run's buffers. */
export const GPT2_SIZES: Readonly<Record<string, number>> = {
  batch: 4,
  context: 256,
  "eval-windows": 16,
  "max-new-tokens": 50,
};

const VALUE_FLAGS = [
  "weights",
  "random",
  "heads",
  "data",
  "steps",
  "batch",
  "accum",
  "context",
  "lr",
  "warmup",
  "validation",
  "eval-every",
  "eval-windows",
  "log-every",
  "seed",
  "save",
  "resume",
  "save-weights",
  "prompt",
  "max-new-tokens",
  "temperature",
  "top-k",
  "backend",
  "optim-states",
  "grad-dtype",
];

/**
 * The flags in `args`, or null for --help. Throws a UsageError for a bad one
 * (an unknown flag names the closest known one).
 */
export function parseGpt2Args(args: string[]): Gpt2Args | null {
  const text = (d: string) => ({ type: "string" as const, default: d });
  const size = (flag: string) => text(String(GPT2_SIZES[flag]));
  const flag = { type: "boolean" as const, default: false };
  const optional = { type: "string" as const };
  const ampFlag = ampDtypeFlag(args);
  const { values: v } = parseFlags({
    args: withNegativeValues(ampFlag.args, VALUE_FLAGS),
    strict: true,
    allowPositionals: false,
    options: {
      weights: optional,
      random: optional,
      heads: optional,
      data: optional,
      steps: text("100"),
      batch: size("batch"),
      accum: text("1"),
      context: size("context"),
      lr: text("1e-4"),
      warmup: text("10"),
      amp: flag,
      fp16: flag,
      checkpoint: flag,
      validation: text("0.1"),
      "eval-every": text("50"),
      "eval-windows": size("eval-windows"),
      "log-every": text("10"),
      seed: text("0"),
      save: optional,
      resume: optional,
      override: flag,
      overwrite: flag,
      "save-weights": optional,
      prompt: optional,
      "max-new-tokens": size("max-new-tokens"),
      temperature: text("0.8"),
      "top-k": text("40"),
      json: flag,
      "no-capture": flag,
      backend: optional,
      "optim-states": text("f32"),
      "grad-dtype": text("f32"),
      help: { ...flag, short: "h" },
    },
  });
  if (v.help) return null;
  const int = (name: string, value: string, min: number, max?: number) =>
    integerFlag(name, value, min, max);
  const parsed: Gpt2Args = {
    weights: v.weights,
    random: v.random === undefined ? undefined : choiceFlag("random", v.random, GPT2_RANDOM_SIZES),
    heads: v.heads === undefined ? undefined : int("heads", v.heads, 1),
    data: v.data,
    steps: int("steps", v.steps, 1),
    batch: int("batch", v.batch, 1),
    accum: int("accum", v.accum, 1),
    context: int("context", v.context, 2),
    lr: numberFlag("lr", v.lr, (x) => x > 0, "a number > 0"),
    warmup: int("warmup", v.warmup, 0),
    amp: v.amp || v.fp16,
    ampDtype: ampFlag.dtype,
    checkpoint: v.checkpoint,
    capture: !v["no-capture"],
    validation: numberFlag("validation", v.validation, (x) => x > 0 && x < 1, "in (0, 1)"),
    evalEvery: int("eval-every", v["eval-every"], 1),
    evalWindows: int("eval-windows", v["eval-windows"], 1),
    logEvery: int("log-every", v["log-every"], 1),
    seed: int("seed", v.seed, 0),
    save: v.save,
    resume: v.resume,
    override: v.override,
    overwrite: v.overwrite,
    saveWeights: v["save-weights"],
    prompt: v.prompt,
    maxNewTokens: int("max-new-tokens", v["max-new-tokens"], 1),
    temperature: numberFlag("temperature", v.temperature, (x) => x >= 0, "a number >= 0"),
    topK: int("top-k", v["top-k"], 0),
    json: v.json,
    backend: backendFlag(v.backend),
    optimStates: optimStatesFlag(v["optim-states"]),
    gradDtype: "f32",
  };
  parsed.gradDtype = gradDtypeFlag(v["grad-dtype"], parsed);
  if ((parsed.weights === undefined) === (parsed.random === undefined)) {
    throw new UsageError("give --weights model.safetensors, or --random 124M for random weights.");
  }
  if (parsed.data === undefined && parsed.prompt === undefined) {
    throw new UsageError("nothing to do: give --data (fine-tune) and/or --prompt (sample).");
  }
  if (parsed.data === undefined) {
    for (
      const [name, given] of [["save", v.save], ["resume", v.resume], [
        "save-weights",
        v["save-weights"],
      ]]
    ) {
      if (given !== undefined) throw new UsageError(`--${name} needs --data (it saves training).`);
    }
  }
  if (parsed.override && !parsed.resume) throw new UsageError("--override needs --resume.");
  if (parsed.overwrite && !parsed.save && !parsed.saveWeights) {
    throw new UsageError(
      "--overwrite is for --save and --save-weights: it lets the run replace the files there.",
    );
  }
  return parsed;
}

export { UsageError };
