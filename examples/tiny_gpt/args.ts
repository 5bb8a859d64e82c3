/**
 * The command line of `tiny_gpt.ts`: its help text and flag parsing.
 *
 * @module
 */
import {
  integerFlag,
  numberFlag,
  parseFlags,
  UsageError,
  withNegativeValues,
} from "../cli/flags.ts";
import { profileSteps } from "../cli/profile_window.ts";
import { ampDtypeFlag, type AmpFlagDtype } from "../cli/amp_flag.ts";
import { backendFlag, backendHelp } from "../cli/backend_flag.ts";
import { captureHelp } from "../cli/capture_flag.ts";
import { optimStatesFlag, optimStatesHelp } from "../cli/optim_states_flag.ts";
import { gradDtypeFlag, gradDtypeHelp } from "../cli/grad_dtype_flag.ts";
import type { Backend, GradDType, StateDtype } from "../../mod.ts";

/** `tiny_gpt.ts --help`. */
export const TINY_GPT_HELP =
  `Train a tiny GPT on English words, character by character, on the GPU (WebGPU).

Usage: deno run -A examples/tiny_gpt.ts [flags]

Data: the ~275k words of the npm package an-array-of-english-words, shuffled
(--seed) and split by word: 95% for training, 5% held out. Each split is one
stream "\\nword\\nword\\n..."; training draws windows of --context characters at
random offsets, validation scores the first --eval-windows consecutive windows
of the held-out stream (every character once). The baseline is a bigram model
with add-one smoothing counted on the training stream, scored on the same
validation characters. Losses are nats per character.
With --data FILE the model trains on your own text instead (nanoGPT's
shakespeare-char workflow): its characters are the vocabulary, the first 90%
trains, the last 10% is held out, and the samples are lines.

Flags:
  --data PATH        train on this UTF-8 text file, character by character,
                     instead of the word list
  --steps N          optimizer steps (default 400: with the other defaults
                     40 s to 6 min on the CPU adapter, lavapipe on 2 vCPUs,
                     alone or beside other jobs; seconds on a GPU)
  --batch N          sequences per step (default 32); also the evaluation batch
  --context N        characters per sequence, T (default 32)
  --layers N         transformer blocks (default 2)
  --dim N            model size C (default 64)
  --heads N          attention heads, must divide --dim (default 4)
  --lr X             peak AdamW learning rate (default 1e-2; weight decay 0.01,
                     gradients clipped to norm 1, cosine decay to lr/10)
${optimStatesHelp(21)}
${gradDtypeHelp(21)}
  --warmup N         steps of linear learning-rate warmup (default 20)
  --amp, --fp16      mixed precision: f16 autocast, fp32 master weights with f16
                     working copies, dynamic loss scaling (needs shader-f16;
                     falls back to f32 and says so without it)
  --amp bf16         mixed precision in bf16: bf16 autocast and working copies,
                     no loss scaling; needs no shader-f16
  --tie-embeddings   the head uses the token table as its weight: one parameter
                     (nanoGPT's wte / lm_head weight tying)
  --no-head-bias     no bias in the head (nanoGPT's lm_head)
  --no-bias          no biases in the blocks' projections and LayerNorms
                     (nanoGPT's bias=False)
  --gelu none|tanh   the MLP's GELU: none = exact erf, PyTorch's nn.GELU() and
                     nanoGPT's (default); tanh = GPT-2's approximation
  --save-nanogpt PATH
                     after training, save the model under nanoGPT's names
                     (safetensors; transformer.wte, transformer.h.{i}.attn.c_attn,
                     lm_head, ...); with --tie-embeddings --no-head-bias nanoGPT's
                     GPT loads it with load_state_dict(strict=True)
  --checkpoint       gradient checkpointing: each block keeps only its input and
                     recomputes its activations in backward (same gradients,
                     less peak memory, one more forward pass per block)
  --seed N           seed of the word split, the init, the batches and the
                     samples (default 0)
  --log-every N      read the training loss back every N steps (default 50);
                     each read waits for the GPU. The loss printed is the mean
                     over those N steps, summed on the GPU without syncing
  --eval-windows N   validation windows of --context characters (default 512)
  --samples N        words to sample at the end (default 8)
  --temperature X    sampling temperature (default 0.8)
  --plot PATH        write an SVG chart of training loss and loss scale to PATH;
                     with --inspect also a heat map of each layer's f16
                     overflow and underflow over steps to PATH with
                     .numerics.svg for .svg
  --inspect          watch every op with a numerics inspector (counted on the
                     GPU, read when the loss is logged): at the end, or when
                     training diverged, print the first op that produced a
                     NaN/Inf and the layers with the most NaN/Inf, f16 overflow
                     and f16 underflow (with --json, an "inspect" event holding
                     the whole report)
  --profile N        profile N training steps (from step 11) and print the GPU
                     time of every kernel (HALFSTEP_PROFILE=N does the same)
  --overwrite        replace the files --plot and --save-nanogpt name although
                     they are there (without it such a run is refused before
                     it starts; the --data file is never replaced)
${captureHelp(21)}
  --json             print one JSON object per line instead of text; the last
                     line is {"event":"final", "validationLoss", "bigramLoss",
                     "stepsPerSecond", "peakBytes", "wallSeconds", "samples", ...}
${backendHelp(21)}
  -h, --help         show this help

Exit status: 0 done; 1 a file could not be read or written; 2 a bad flag, a
--data that is not UTF-8 text or too short, an output holding a file without
--overwrite, or sizes that cannot fit this adapter or host (checked before the
model is built); 3 training diverged (a non-finite validation loss or weights;
in f32 a non-finite logged loss; under --amp steps skipped with the loss scale
at its floor, or 50 in a row).

Memory: "peak" is the buffer pool's peakBytes over the training steps (after
start-up). That the loop leaks no GPU memory is checked by tests/gpu/device/memory_test.ts.
`;

/** Flags that take a value (for negative values such as `--steps -3`). */
const VALUE_FLAGS = [
  "steps",
  "batch",
  "context",
  "layers",
  "dim",
  "heads",
  "lr",
  "warmup",
  "seed",
  "log-every",
  "eval-windows",
  "samples",
  "temperature",
  "plot",
  "profile",
  "gelu",
  "save-nanogpt",
  "data",
  "backend",
  "optim-states",
  "grad-dtype",
];

/** The parsed flags. */
export interface TinyGptArgs {
  steps: number;
  batch: number;
  context: number;
  layers: number;
  dim: number;
  heads: number;
  lr: number;
  warmup: number;
  amp: boolean;
  /** The dtype of --amp: f16 (`--amp` alone, `--fp16`) or bf16 (`--amp bf16`). */
  ampDtype: AmpFlagDtype;
  checkpoint: boolean;
  seed: number;
  logEvery: number;
  evalWindows: number;
  samples: number;
  temperature: number;
  json: boolean;
  plot: string | undefined;
  /** Replace files already at the output paths. */
  overwrite: boolean;
  /** Attach a numerics inspector; report it at the end (and a heat map with --plot). */
  inspect: boolean;
  /** Capture the training step (not --no-capture, nor --inspect). */
  capture: boolean;
  /** Steps to profile (from --profile or HALFSTEP_PROFILE), if any. */
  profile: number | undefined;
  /** The head shares the token table (--tie-embeddings). */
  tieEmbeddings: boolean;
  /** A bias in the head (false with --no-head-bias). */
  headBias: boolean;
  /** Biases in the blocks and LayerNorms (false with --no-bias). */
  bias: boolean;
  /** The MLP's GELU (--gelu). */
  gelu: "none" | "tanh";
  /** Where to save the model under nanoGPT's names (--save-nanogpt), if anywhere. */
  saveNanoGpt: string | undefined;
  /** A text file to train on instead of the word list (--data), if any. */
  data: string | undefined;
  /** The WebGPU backend (--backend); undefined: initGpu's default. */
  backend: Backend | undefined;
  /** How AdamW keeps its moments (--optim-states). */
  optimStates: StateDtype;
  /** What the masters' gradients are kept in (--grad-dtype). */
  gradDtype: GradDType;
}

export { UsageError };

/** The defaults of the flags that size a run's buffers (the help text says them too). */
export const TINY_GPT_SIZES: Readonly<Record<string, number>> = {
  batch: 32,
  context: 32,
  layers: 2,
  dim: 64,
  samples: 8,
  "eval-windows": 512,
};

/** The flags in `args`, or null for --help. */
export function parseTinyGptArgs(args: string[]): TinyGptArgs | null {
  const text = (d: string) => ({ type: "string" as const, default: d });
  const size = (flag: string) => text(String(TINY_GPT_SIZES[flag]));
  const flag = { type: "boolean" as const, default: false };
  const ampFlag = ampDtypeFlag(args);
  const { values: v } = parseFlags({
    args: withNegativeValues(ampFlag.args, VALUE_FLAGS),
    strict: true,
    allowPositionals: false,
    options: {
      steps: text("400"),
      batch: size("batch"),
      context: size("context"),
      layers: size("layers"),
      dim: size("dim"),
      heads: text("4"),
      lr: text("1e-2"),
      warmup: text("20"),
      amp: flag,
      fp16: flag,
      checkpoint: flag,
      seed: text("0"),
      "log-every": text("50"),
      "eval-windows": size("eval-windows"),
      samples: size("samples"),
      temperature: text("0.8"),
      json: flag,
      inspect: flag,
      "no-capture": flag,
      plot: { type: "string" },
      overwrite: flag,
      profile: { type: "string" },
      "tie-embeddings": flag,
      "no-head-bias": flag,
      "no-bias": flag,
      gelu: text("none"),
      "save-nanogpt": { type: "string" },
      data: { type: "string" },
      backend: { type: "string" },
      "optim-states": text("f32"),
      "grad-dtype": text("f32"),
      help: { ...flag, short: "h" },
    },
  });
  if (v.help) return null;
  const int = (name: string, value: string, min: number) => integerFlag(name, value, min);
  const positive = (name: string, value: string) =>
    numberFlag(name, value, (x) => x > 0, "a number > 0");
  const parsed: TinyGptArgs = {
    steps: int("steps", v.steps, 1),
    batch: int("batch", v.batch, 1),
    context: int("context", v.context, 2),
    layers: int("layers", v.layers, 1),
    dim: int("dim", v.dim, 1),
    heads: int("heads", v.heads, 1),
    lr: positive("lr", v.lr),
    warmup: int("warmup", v.warmup, 0),
    amp: v.amp || v.fp16,
    ampDtype: ampFlag.dtype,
    checkpoint: v.checkpoint,
    seed: int("seed", v.seed, 0),
    logEvery: int("log-every", v["log-every"], 1),
    evalWindows: int("eval-windows", v["eval-windows"], 1),
    samples: int("samples", v.samples, 1),
    temperature: positive("temperature", v.temperature),
    json: v.json,
    plot: v.plot,
    overwrite: v.overwrite,
    inspect: v.inspect,
    capture: !v["no-capture"] && !v.inspect,
    profile: profileSteps(v.profile === undefined ? undefined : int("profile", v.profile, 1)),
    tieEmbeddings: v["tie-embeddings"],
    headBias: !v["no-head-bias"],
    bias: !v["no-bias"],
    gelu: geluFlag(v.gelu),
    saveNanoGpt: v["save-nanogpt"],
    data: v.data,
    backend: backendFlag(v.backend),
    optimStates: optimStatesFlag(v["optim-states"]),
    gradDtype: "f32",
  };
  // tiny_gpt has no --accum: one micro-batch a step.
  parsed.gradDtype = gradDtypeFlag(v["grad-dtype"], { ...parsed, accum: 1 });
  if (parsed.overwrite && !parsed.plot && !parsed.saveNanoGpt) {
    throw new UsageError(
      "--overwrite is for --plot and --save-nanogpt: it lets the run replace the files there.",
    );
  }
  if (parsed.dim % parsed.heads !== 0) {
    throw new UsageError(`--heads (${parsed.heads}) must divide --dim (${parsed.dim}).`);
  }
  return parsed;
}

/** The value of --gelu: PyTorch's `approximate` names. */
function geluFlag(value: string): "none" | "tanh" {
  if (value === "none" || value === "tanh") return value;
  throw new UsageError(
    `--gelu must be none (exact) or tanh, got ${JSON.stringify(value.slice(0, 20))}.`,
  );
}
