/**
 * Trains a 784-256-256-10 MLP (Linear/ReLU/Linear/ReLU/Linear), or with
 * `--model cnn` a small CNN (two Conv2d/BatchNorm2d/ReLU/MaxPool2d blocks and
 * a Linear), on the real MNIST data with Adam (default) or SGD (momentum
 * optional), using only the public API of `mod.ts`, and reports test
 * accuracy, speed and GPU memory.
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
import {
  Adam,
  addInPlace,
  AmpTrainer,
  cosineSchedule,
  crossEntropy,
  type Gpu,
  initGpu,
  LrScheduler,
  noGrad,
  RandomGenerator,
  SGD,
  Tensor,
} from "../mod.ts";
import { saveTrainingState } from "../files.ts";
import { DivergenceWatch, evaluationHealth, type Health } from "./cli/divergence.ts";
import { checkPlan, runLimits } from "./cli/preflight.ts";
import { SaveLock } from "./runs/save_lock.ts";
import { finishInspect, heatmapPath, InspectLog } from "./cli/inspect.ts";
import { writeHeatmap } from "./plots/heatmap.ts";
import { FirstStep, Progress } from "./cli/progress.ts";
import { profileFields, ProfileWindow } from "./cli/profile_window.ts";
import { type MnistArgs, mnistFiles, parseMnistArgsOrExit } from "./mnist/args.ts";
import { orExit, orExitAsync, runMain } from "./cli/flags.ts";
import {
  checkBeforeStart,
  MNIST_RUN,
  resumeOrStart,
  runFlags,
  type RunRecord,
} from "./mnist/resume.ts";
import { readRecordOrExit } from "./runs/run_file.ts";
import { checkOutputsReplace, checkOutputsWritable, sameFile } from "./runs/outputs.ts";
import { evaluate } from "./mnist/evaluate.ts";
import { precisionName } from "./cli/amp_flag.ts";
import { trainingStep } from "./cli/capture_flag.ts";
import { gather, loadData, randomShifts, shuffle } from "./data/mnist_batches.ts";
import { MNIST_PIXELS } from "./data/mnist.ts";
import { mnistBuffers, mnistInputShape, mnistModel } from "./mnist/model.ts";
import { report, reportStart, writePlot } from "./mnist/report.ts";
import { type Emit, type Run, Tally } from "./mnist/run.ts";

/** The model, its optimizer, the AMP trainer, the learning-rate schedule and --inspect's log. */
function makeTrainer(cfg: MnistArgs, optimizerSteps: number) {
  const model = mnistModel(cfg.model, cfg.seed);
  if (cfg.checkpoint) model.checkpoint = "auto";
  model.train();
  const optimizer = cfg.optimizer === "sgd"
    ? new SGD(model.parameters(), { lr: cfg.lr, momentum: cfg.momentum })
    : new Adam(model.parameters(), { lr: cfg.lr, stateDtype: cfg.optimStates });
  // --inspect: every step of the trainer is watched (counted on the GPU, read when logging).
  const inspect = cfg.inspect ? new InspectLog(model) : null;
  const trainer = new AmpTrainer(model, optimizer, {
    inspector: inspect?.inspector,
    enabled: cfg.amp,
    dtype: cfg.ampDtype,
    lossScale: cfg.lossScale,
    accumulationSteps: cfg.accum,
  });
  const scheduler = new LrScheduler(
    optimizer,
    cfg.schedule === "cosine"
      ? cosineSchedule({
        // 2% warmup, but never every step (a one-step run would have lr 0).
        warmupSteps: Math.min(Math.ceil(optimizerSteps * 0.02), optimizerSteps - 1),
        totalSteps: optimizerSteps,
      })
      : () => 1,
  );
  // Captured (recorded in its first steps, then replayed): the same bits as uncaptured.
  const step = trainingStep(trainer, (x, y) => crossEntropy(model.forward(x), y), cfg);
  return { model, optimizer, trainer, step, scheduler, inspect };
}

/**
 * One pass over the shuffled training set. Never waits for the GPU except to
 * log: every `--log-every` steps and at the end of the epoch.
 */
async function trainEpoch(
  run: Run,
  tally: Tally,
  epoch: number,
  progress: Progress,
  from = 0,
) {
  const { cfg, train, batch, trainer, scheduler, totalSteps } = run;
  const pixels = new Float32Array(batch * MNIST_PIXELS), labels = new Int32Array(batch);
  const order = shuffle(train.count, run.shuffler);
  const shifts = cfg.shift > 0 ? randomShifts(train.count, cfg.shift, run.shuffler) : null;
  let intervalStart = performance.now(), intervalStep = tally.step;
  let barText = `epoch ${epoch}`; // the last logged loss joins it
  for (let s = from; s < run.stepsPerEpoch; s++) {
    gather(train, order, s * batch, batch, pixels, labels, shifts);
    run.profile?.before(tally.step + 1);
    const lr = run.optimizer.groups[0].lr; // this step's (the scheduler moves it after the step)
    // One micro-batch: forward under autocast (with --amp), scaled backward;
    // every --accum micro-batches the trainer unscales, checks for overflow,
    // steps the optimizer (skipped on the GPU on overflow) and updates the scale.
    run.firstStep.before();
    // The batch goes from host arrays straight into the step's input buffers.
    const loss = run.step.run(
      { data: pixels, shape: mnistInputShape(cfg.model, batch) },
      { data: labels, shape: [batch], dtype: "i32" },
    );
    run.firstStep.after();
    if (tally.step % cfg.accum === cfg.accum - 1) scheduler.step(); // after each optimizer step
    noGrad(() => addInPlace(tally.lossSum, loss));
    loss.dispose();
    tally.lossCount++;
    const step = ++tally.step;
    const report = await run.profile?.after(step);
    if (report) {
      const { first, last } = run.profile!;
      run.emit("profile", profileFields(report, first, last), report.table());
    }
    if (step === 10 || step === 200 || step === totalSteps) {
      tally.allocatedAfter.set(step, run.gpu.memoryStats().allocatedBytes);
    }
    if (step % cfg.logEvery === 0 || step === totalSteps || s === run.stepsPerEpoch - 1) {
      tally.lastLoss = (await tally.lossSum.item()) / tally.lossCount; // the sync point
      await run.inspect?.interval(step); // --inspect: its counts since the last log (one more read)
      const now = performance.now();
      const seconds = (now - intervalStart) / 1000;
      tally.trainSeconds += seconds;
      const stepsPerSecond = (step - intervalStep) / seconds;
      // The scale is read only when logging (a sync, like the loss).
      const scale = cfg.amp || cfg.plot ? await trainer.scaler.getScale() : 1;
      tally.plotPoints.push({ step, loss: tally.lastLoss, lossScale: scale });
      const text = `loss ${tally.lastLoss.toFixed(4)}  ${stepsPerSecond.toFixed(1)} steps/s` +
        (cfg.amp ? `  scale ${scale}` : "");
      barText = `epoch ${epoch}  ${text}`;
      if (!progress.isBar) {
        const eta = progress.eta(step, totalSteps);
        run.emit(
          "step",
          {
            epoch,
            step,
            loss: tally.lastLoss,
            lossSteps: tally.lossCount,
            lr,
            stepsPerSecond,
            lossScale: scale,
          },
          `epoch ${epoch} step ${String(step).padStart(5)}/${totalSteps}  ${text}` +
            (eta ? `  ${eta}` : ""),
        );
      }
      tally.lossSum.dispose();
      tally.lossSum = Tensor.zeros([]);
      tally.lossCount = 0;
      intervalStart = now;
      intervalStep = step;
    }
    progress.update(step, totalSteps, barText); // every step: no silence until the next log
  }
  progress.finish();
}

/**
 * Runs one write of the run's outputs (the saved state, the chart). A failure
 * is one clear line; then the run stops (exit status 1) or, with
 * `--on-save-error continue`, goes on. The file it was writing is never left
 * damaged (writes are atomic).
 */
async function writeOutput(run: Run, what: string, write: () => Promise<void>): Promise<boolean> {
  try {
    await write();
    return true;
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    const next = run.cfg.onSaveError === "stop"
      ? "stopping (--on-save-error continue keeps training)"
      : "training goes on";
    // A failure is a notice: on stderr (as gpt2.ts's), and an event too with --json.
    console.error(`mnist: writing ${what} failed: ${why}; ${next}`);
    if (run.cfg.json) run.emit("save_error", { what, error: why }, "");
    if (run.cfg.onSaveError === "stop") {
      run.gpu.destroy();
      Deno.exit(1);
    }
    return false;
  }
}

/**
 * After `epoch`: rewrites `--plot` and saves the run to `--save` (model,
 * optimizer, trainer, data order, the chart's points), so a killed run
 * leaves both.
 */
async function save(run: Run, tally: Tally, epoch: number): Promise<void> {
  const { cfg, model, optimizer, trainer } = run;
  const step = tally.step;
  if (cfg.plot) await writeOutput(run, cfg.plot, () => writePlot(run, tally));
  if (cfg.plot && run.inspect) {
    const path = heatmapPath(cfg.plot), inspect = run.inspect;
    await writeOutput(run, path, () => writeHeatmap(path, inspect.intervals, heatmapTitle(cfg)));
  }
  if (cfg.save) {
    const state: RunRecord = {
      epoch,
      step,
      shuffler: run.shuffler.state(),
      position: 0,
      flags: runFlags(cfg, run.train.count, run.batch),
      plotPoints: tally.plotPoints,
    };
    const saved = await writeOutput(
      run,
      cfg.save,
      // The schedule goes in the file so PyTorch continues it (examples/torch/); resuming here
      // rebuilds it from the flags instead, so `--override --lr` can change its base.
      () =>
        saveTrainingState(cfg.save!, { model, optimizer, trainer, scheduler: run.scheduler }, {
          extra: state,
        }),
    );
    if (saved) {
      run.saves.holds = `epoch ${epoch} (step ${step})`;
      run.lock?.hold(run.saves.holds);
      run.emit("save", { path: cfg.save, epoch, step }, `saved ${cfg.save} (epoch ${epoch})`);
    }
    run.saves.failed += saved ? 0 : 1;
    run.saves.lastFailed = !saved;
  }
}

/**
 * Exits with status 2, before anything trains, when a training or an
 * evaluation batch needs a buffer over this adapter's limit.
 */
function checkFits(cfg: MnistArgs, gpu: Gpu, batch: number, testImages: number): void {
  const evalBatch = Math.min(cfg.evalBatch, testImages);
  const gpuBuffers = [
    ...mnistBuffers(cfg.model, batch, "batch"),
    ...mnistBuffers(cfg.model, evalBatch, "eval-batch"),
  ];
  const defaults = { batch: 128, "eval-batch": 1000 };
  orExit("mnist", () => checkPlan({ gpu: gpuBuffers, host: [] }, runLimits(gpu), defaults));
}

/**
 * After an epoch's last loss was read: stops the run (exit status 3) when
 * training diverged, before anything is saved over the last good file, and
 * passes a warning on (most steps skipped). One more read: the weights' sum.
 */
async function stopIfDiverged(run: Run, tally: Tally, health: Health, epoch: number) {
  if (health.warning) {
    run.emit("warning", { epoch, warning: health.warning }, `epoch ${epoch}: ${health.warning}`);
  }
  if (!health.diverged) return;
  // --inspect says where it broke: the first op whose output or gradient held a NaN/Inf.
  await writeInspect(run);
  const kept = run.cfg.save ? `; nothing was saved over ${run.cfg.save}` : "";
  if (run.cfg.json) run.emit("diverged", { epoch, step: tally.step, reason: health.diverged }, "");
  console.error(
    `mnist: training diverged in epoch ${epoch} (step ${tally.step}): ${health.diverged}${kept}.`,
  );
  run.gpu.destroy();
  Deno.exit(3);
}

/** The title of --inspect's heat map. */
function heatmapTitle(cfg: MnistArgs): string {
  return `MNIST ${cfg.model.toUpperCase()}, ${
    precisionName(cfg.amp, cfg.ampDtype)
  }: values f16 cannot hold`;
}

/** With --inspect: prints the run's numerics report and writes its heat map beside --plot. */
async function writeInspect(run: Run): Promise<void> {
  const { cfg, emit, inspect } = run;
  if (!inspect) return;
  const out = { emit, plot: cfg.plot, title: heatmapTitle(cfg) };
  await writeOutput(
    run,
    cfg.plot ? heatmapPath(cfg.plot) : "the numerics report",
    () => finishInspect(inspect, out),
  );
}

async function main(): Promise<void> {
  const started = performance.now();
  const cfg = parseMnistArgsOrExit(Deno.args);
  if (cfg === null) return; // --help
  const emit: Emit = (event, fields, text) =>
    console.log(cfg.json ? JSON.stringify({ event, ...fields }) : text);
  // A --resume file that cannot continue here is reported before any start-up work.
  const record = await readRecordOrExit("mnist", cfg.resume, MNIST_RUN);
  const files = mnistFiles(cfg, MNIST_RUN);
  await checkOutputsWritable(files.outputs).catch((e) => {
    console.error(`mnist: ${e instanceof Error ? e.message : e} (see --help)`);
    Deno.exit(2);
  });
  // The lock first: a run in use says so, not that its file holds a run.
  const note = (text: string) => console.error(`mnist: ${text}`);
  const lock = cfg.save
    ? await orExitAsync("mnist", () => SaveLock.acquire(cfg.save!, "save", note))
    : null;
  await orExitAsync(
    "mnist",
    () => checkOutputsReplace(files.outputs, { inputs: files.inputs, overwrite: cfg.overwrite }),
  );
  const { train, test } = await loadData(cfg);
  const batch = Math.min(cfg.batch, train.count), stepsPerEpoch = Math.floor(train.count / batch);
  const changes = checkBeforeStart(cfg, train.count, batch, record);
  const loadSeconds = (performance.now() - started) / 1000;
  const gpu = await initGpu({ backend: cfg.backend, deterministic: cfg.deterministic });
  const initSeconds = (performance.now() - started) / 1000 - loadSeconds;
  gpu.resetPeakMemory();
  const sizes = { batch, stepsPerEpoch, totalSteps: stepsPerEpoch * cfg.epochs };
  checkFits(cfg, gpu, batch, test.count);
  reportStart({ cfg, emit, gpu, train, test, ...sizes }, { loadSeconds, initSeconds });
  const parts = makeTrainer(cfg, Math.floor(sizes.totalSteps / cfg.accum));
  const shuffler = new RandomGenerator(cfg.seed + 1);
  const profile = cfg.profile ? new ProfileWindow(gpu, cfg.profile, sizes.totalSteps) : null;
  const run: Run = {
    cfg,
    emit,
    gpu,
    train,
    test,
    ...sizes,
    ...parts,
    shuffler,
    profile,
    started,
    firstStep: new FirstStep(emit, cfg.logEvery),
    lock,
    saves: { failed: 0, lastFailed: false, holds: null },
  };
  const from = await resumeOrStart(run, record, changes);
  if (record && cfg.save && await sameFile(cfg.save, cfg.resume!)) {
    run.saves.holds = MNIST_RUN.describe(record); // until this session's first save
    lock?.hold(run.saves.holds);
  }
  run.inspect?.startAfter(from.step);
  const progress = new Progress(!cfg.json);
  const tally = new Tally(from.step, from.plotPoints);
  const watch = await DivergenceWatch.start(run.trainer);
  for (let epoch = from.epoch; epoch <= cfg.epochs; epoch++) {
    await trainEpoch(run, tally, epoch, progress, epoch === from.epoch ? from.position : 0);
    await stopIfDiverged(
      run,
      tally,
      await watch.check(tally.lastLoss, parts.model.parameters()),
      epoch,
    );
    await evaluate(run, tally, epoch);
    await stopIfDiverged(run, tally, evaluationHealth(tally.testLoss, run.trainer), epoch);
    await save(run, tally, epoch);
  }
  if (from.epoch > cfg.epochs) await evaluate(run, tally, cfg.epochs); // a finished run
  await writeInspect(run);
  run.inspect?.dispose();
  await report(run, tally, started);
  gpu.destroy();
  lock?.release();
  if (run.saves.failed > 0) endAfterFailedSaves(run);
}

/**
 * The last word of a run whose saves failed (--on-save-error continue): how
 * many, and what the file holds; exit status 1 when the last one failed
 * (the run's end is not in the file).
 */
function endAfterFailedSaves(run: Run): void {
  const { failed, lastFailed, holds } = run.saves, path = run.cfg.save!;
  const saves = `${failed} save${failed === 1 ? "" : "s"} of ${path} failed`;
  if (!lastFailed) {
    console.error(`mnist: ${saves}; the last one succeeded: it holds ${holds}.`);
    return;
  }
  const kept = holds === null
    ? `nothing was saved to ${path}`
    : `the last save that succeeded holds ${holds}: --resume ${path} continues from there`;
  console.error(`mnist: ${saves}, the last one's included; ${kept}.`);
  Deno.exit(1);
}

if (import.meta.main) await runMain("mnist", main);
