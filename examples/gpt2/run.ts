/**
 * A `gpt2.ts` fine-tuning run once the model is built: AdamW, the trainer
 * and the schedule ({@link fineTune}), the training loop
 * (`--accum` micro-batches per optimizer step, the loss read back every
 * `--log-every` steps), validation, the divergence checks before anything is
 * saved, and `--save` / `--resume` with the record of the run
 * ({@link GPT2_RUN}) that the checks before start-up read.
 *
 * @module
 */
import { type TrainingStep, trainingStep } from "../cli/capture_flag.ts";
import {
  AdamW,
  addInPlace,
  AmpTrainer,
  cosineSchedule,
  type Gpu,
  LrScheduler,
  noGrad,
  RandomGenerator,
  Tensor,
  tidy,
} from "../../mod.ts";
import { loadTrainingState, saveTrainingState } from "../../files.ts";
import { reason } from "../cli/flags.ts";
import { sameFile } from "../runs/outputs.ts";
import type { SaveLock } from "../runs/save_lock.ts";
import { DivergenceWatch, evaluationHealth, type Health } from "../cli/divergence.ts";
import { FirstStep, Progress } from "../cli/progress.ts";
import {
  describeChanges,
  type FlagChange,
  type FlagValues,
  lengthChanges,
} from "../cli/resume_flags.ts";
import type { RunRecordKind } from "../runs/run_file.ts";
import type { Gpt2Args } from "./args.ts";
import type { TokenSplit } from "../data/gpt2_tokens.ts";
import { saveGpt2 } from "../../models/mod.ts";
import type { Gpt } from "../../models/mod.ts";
import { evaluationWindows, sampleBatch } from "../data/words.ts";

/** Prints one event: a JSON line with --json, else `text`. */
export type Emit = (event: string, fields: Record<string, unknown>, text: string) => void;

/** A fine-tuning run: the flags, the data and what trains. */
export interface Run {
  cfg: Gpt2Args;
  emit: Emit;
  gpu: Gpu;
  data: TokenSplit;
  model: Gpt;
  optimizer: AdamW;
  trainer: AmpTrainer;
  /** One micro-batch, captured unless --no-capture. */
  step: TrainingStep;
  scheduler: LrScheduler;
  /** Draws the training windows; saved with the run. */
  batches: RandomGenerator;
  /** --save's lock (told what the file holds after each save), or null. */
  lock: SaveLock | null;
}

/** What --save writes besides the model, optimizer and trainer (the training state's `extra`). */
export interface SavedRun {
  step: number;
  batches: { seed: number; offset: number };
  flags: { shape: FlagValues; steering: FlagValues; length?: FlagValues };
}

/** gpt2.ts's record in a parsed `extra`, or null when it is not one. */
function savedRunOf(extra: unknown): SavedRun | null {
  const r = extra as SavedRun | null;
  const count = (x: unknown) => Number.isSafeInteger(x) && (x as number) >= 0;
  const object = (x: unknown) => typeof x === "object" && x !== null;
  const ok = object(r) && count(r!.step) && object(r!.batches) && count(r!.batches.seed) &&
    count(r!.batches.offset) && object(r!.flags) && object(r!.flags.shape);
  return ok ? r : null;
}

/** What gpt2.ts keeps in a training state, for the checks before start-up (`runs/run_file.ts`). */
export const GPT2_RUN: RunRecordKind<SavedRun> = {
  script: "gpt2.ts",
  holds: "step, data order",
  recordOf: savedRunOf,
  describe: (r) => `step ${r.step}`,
  replaced: "at the first good validation",
};

/**
 * The flags a saved run records: those a resumed run must repeat, those
 * --override may change, and its length (--steps), which a resumed run may
 * change (the schedule then runs to the new total).
 */
export function runFlags(
  cfg: Gpt2Args,
): { shape: FlagValues; steering: FlagValues; length: FlagValues } {
  return {
    shape: {
      weights: cfg.weights ?? `random ${cfg.random}`,
      data: cfg.data!,
      batch: cfg.batch,
      accum: cfg.accum,
      context: cfg.context,
      warmup: cfg.warmup,
      validation: cfg.validation,
      amp: cfg.amp && cfg.ampDtype === "bf16" ? "bf16" : cfg.amp,
      seed: cfg.seed,
      // The optimizer's state layout: a file of 8-bit moments resumes only with 8-bit ones.
      "optim-states": cfg.optimStates,
    },
    steering: { lr: cfg.lr },
    length: { steps: cfg.steps },
  };
}

/**
 * Restores the run `record` came from (checked before start-up, with the
 * flag `changes` --override accepted); returns the step to go on from.
 * Exits with status 1, in one line, when the file does not fit the model.
 */
export async function resumeOrStart(
  run: Run,
  record: SavedRun | null,
  changes: FlagChange[],
): Promise<number> {
  const { cfg, model, optimizer, trainer } = run;
  if (!cfg.resume || !record) return 0;
  await loadTrainingState(cfg.resume, { model, optimizer, trainer }).catch((e) => {
    console.error(`gpt2: cannot resume: ${reason(e)}`);
    run.gpu.destroy();
    Deno.exit(1);
  });
  const path = cfg.resume;
  if (cfg.save && await sameFile(cfg.save, path)) run.lock?.hold(`step ${record.step}`);
  if (changes.length > 0) {
    run.emit("override", { changes }, `--override: resuming with ${describeChanges(changes)}`);
  }
  const longer = lengthChanges(record.flags, runFlags(cfg));
  if (longer.length > 0) {
    const saved = Number(longer[0].saved);
    run.emit(
      "extend",
      { path, step: record.step, savedSteps: saved, steps: cfg.steps },
      `--steps ${cfg.steps} (saved: ${saved}): ${cfg.steps > saved ? "extending" : "shortening"} ` +
        `the run from step ${record.step}; its schedule goes on as a ${cfg.steps}-step one ` +
        `(warmup, then cosine decay to lr/10 at step ${cfg.steps})`,
    );
  }
  run.scheduler.step(trainer.steps);
  run.batches = new RandomGenerator(record.batches.seed, record.batches.offset);
  const finished = record.step >= cfg.steps;
  run.emit(
    "resume",
    { path, step: record.step, finished },
    finished
      ? `${path} holds a finished run (step ${record.step} of ${cfg.steps}): nothing left to ` +
        "train; validating it"
      : `resumed ${path} after step ${record.step}`,
  );
  return record.step;
}

/** Saves the whole run to --save (atomic; exit 1 when it cannot be written). */
async function save(run: Run, step: number): Promise<void> {
  const { cfg, model, optimizer, trainer, scheduler } = run;
  const extra: SavedRun = { step, batches: run.batches.state(), flags: runFlags(cfg) };
  try {
    await saveTrainingState(cfg.save!, { model, optimizer, trainer, scheduler }, { extra });
  } catch (e) {
    console.error(`gpt2: saving ${cfg.save} failed: ${reason(e)}`);
    if (cfg.json) run.emit("save_error", { what: cfg.save, error: reason(e) }, "");
    run.gpu.destroy();
    Deno.exit(1);
  }
  run.lock?.hold(`step ${step}`);
  run.emit("save", { path: cfg.save, step }, `saved ${cfg.save} (step ${step})`);
}

/** Mean loss (nats per token) over the held-out windows, with a progress bar; one sync. */
export async function validate(run: Run): Promise<number> {
  const { cfg, model, trainer } = run;
  const windows = evaluationWindows(run.data.validation, cfg.context, cfg.evalWindows);
  const progress = new Progress(!cfg.json);
  if (!progress.isBar) {
    run.emit(
      "phase",
      { phase: "validate", windows: windows.count },
      `validating: ${windows.count} held-out windows of ${cfg.context} tokens...`,
    );
  }
  model.eval();
  const total = Tensor.zeros([]);
  for (let w = 0; w < windows.count; w += cfg.batch) {
    const n = Math.min(cfg.batch, windows.count - w),
      span = [w * cfg.context, (w + n) * cfg.context];
    noGrad(() =>
      tidy(() => {
        const ids = Tensor.from(windows.inputs.subarray(span[0], span[1]), [n, cfg.context], {
          dtype: "i32",
        });
        const loss = trainer.autocast(() =>
          model.loss(ids, windows.targets.subarray(span[0], span[1]))
        );
        addInPlace(total, loss, { alpha: n / windows.count });
      })
    );
    progress.update(w + n, windows.count, "validating (held-out windows)");
  }
  const loss = await total.item(); // the sync point
  progress.finish();
  total.dispose();
  model.train();
  return loss;
}

/** Stops with exit status 3 when training diverged (before anything is saved over --save). */
function stopIfDiverged(run: Run, health: Health, step: number): void {
  if (health.warning) {
    run.emit("warning", { step, warning: health.warning }, `step ${step}: ${health.warning}`);
  }
  if (!health.diverged) return;
  const kept = run.cfg.save ? `; nothing was saved over ${run.cfg.save}` : "";
  console.error(`gpt2: training diverged at step ${step}: ${health.diverged}${kept}.`);
  run.gpu.destroy();
  Deno.exit(3);
}

/** What training ended with. */
export interface Trained {
  /** The training loss of the last logged interval. */
  loss: number;
  /** The validation loss after the last step. */
  validation: number;
  secondsPerStep: number;
  /** Whether the step was captured, and how often it replayed. */
  capture: ReturnType<TrainingStep["stats"]>;
}

/**
 * --steps optimizer steps of --accum micro-batches each, from `start`. The
 * progress bar moves every step (recording a step is most of its time on a
 * CPU adapter); the loss is read back, and divergence checked, every
 * --log-every steps; validation and --save every --eval-every steps.
 */
export async function train(run: Run, start: number): Promise<Trained> {
  const { cfg, gpu, model, trainer } = run;
  const rows = cfg.batch * cfg.context;
  const inputs = new Int32Array(rows), targets = new Int32Array(rows);
  const progress = new Progress(!cfg.json);
  const watch = await DivergenceWatch.start(trainer);
  let lossSum = Tensor.zeros([]), counted = 0, loss = NaN, validation = NaN;
  let clock = performance.now(), timed = 0, seconds = 0, barText = "training";
  const first = new FirstStep(run.emit, cfg.logEvery);
  gpu.resetPeakMemory();
  for (let step = start + 1; step <= cfg.steps; step++) {
    first.before();
    for (let micro = 0; micro < cfg.accum; micro++) {
      sampleBatch(run.data.train, cfg.context, run.batches, inputs, targets);
      // The batch goes from host arrays straight into the step's input buffers.
      const l = run.step.run(
        { data: inputs, shape: [cfg.batch, cfg.context], dtype: "i32" },
        { data: targets, shape: [rows], dtype: "i32" },
      );
      noGrad(() => addInPlace(lossSum, l));
      l.dispose();
      counted++;
    }
    first.after();
    run.scheduler.step();
    const logNow = step % cfg.logEvery === 0 || step === cfg.steps;
    const evalNow = step % cfg.evalEvery === 0 || step === cfg.steps;
    if (logNow || evalNow) {
      loss = (await lossSum.item()) / counted; // the sync point
      seconds += (performance.now() - clock) / 1000;
      timed += counted / cfg.accum;
      const perStep = seconds / timed;
      stopIfDiverged(run, await watch.check(loss, model.parameters()), step);
      barText = `loss ${loss.toFixed(4)}  ${perStep.toFixed(2)} s/step`;
      if (!progress.isBar) {
        const eta = progress.eta(step, cfg.steps);
        run.emit(
          "step",
          { step, loss, secondsPerStep: perStep },
          `step ${step}/${cfg.steps}  ${barText}${eta ? `  ${eta}` : ""}`,
        );
      }
      lossSum.dispose();
      lossSum = Tensor.zeros([]);
      counted = 0;
    }
    progress.update(step, cfg.steps, barText); // every step: no silence until the next log
    if (evalNow) {
      progress.finish();
      validation = await validate(run);
      run.emit(
        "eval",
        { step, validationLoss: validation },
        `step ${step}: validation loss ${validation.toFixed(4)}`,
      );
      stopIfDiverged(run, evaluationHealth(validation, trainer), step); // AMP's NaN too
      if (cfg.save) await save(run, step);
    }
    if (logNow || evalNow) clock = performance.now(); // reading, validating and saving are not training time
  }
  lossSum.dispose();
  progress.finish();
  return {
    loss,
    validation,
    secondsPerStep: seconds / Math.max(timed, 1),
    capture: run.step.stats(),
  };
}

/** Fine-tunes `model` on the text (from --resume's step, if any); what it ended with. */
export async function fineTune(
  base: Omit<Run, "optimizer" | "trainer" | "step" | "scheduler" | "batches">,
  record: SavedRun | null,
  changes: FlagChange[],
): Promise<{ before: number; trained: Trained | null }> {
  const { cfg, model } = base;
  const optimizer = new AdamW(model.parameters(), {
    lr: cfg.lr,
    weightDecay: 0.01,
    stateDtype: cfg.optimStates,
  });
  const trainer = new AmpTrainer(model, optimizer, {
    enabled: cfg.amp,
    dtype: cfg.ampDtype,
    accumulationSteps: cfg.accum,
    maxGradNorm: 1,
    gradDtype: cfg.gradDtype,
  });
  const scheduler = new LrScheduler(
    optimizer,
    cosineSchedule({
      warmupSteps: Math.min(cfg.warmup, cfg.steps - 1),
      totalSteps: cfg.steps,
      minFactor: 0.1,
    }),
  );
  const batches = new RandomGenerator(cfg.seed + 1);
  // Captured (recorded in its first steps, then replayed): the same bits as uncaptured.
  const step = trainingStep(trainer, (x, y) => model.loss(x, y), cfg);
  const run: Run = { ...base, optimizer, trainer, step, scheduler, batches };
  const start = await resumeOrStart(run, record, changes);
  const before = await validate(run);
  const finished = start >= cfg.steps;
  run.emit(
    "eval",
    { step: start, validationLoss: before },
    `validation loss ${finished ? "" : "before training: "}${before.toFixed(4)}`,
  );
  const trained = finished ? null : await train(run, start);
  if (cfg.saveWeights) {
    await saveGpt2(cfg.saveWeights, model).catch((e) => {
      console.error(`gpt2: writing ${cfg.saveWeights} failed: ${reason(e)}`);
      if (cfg.json) base.emit("save_error", { what: cfg.saveWeights, error: reason(e) }, "");
      Deno.exit(1);
    });
    run.emit(
      "saved",
      { path: cfg.saveWeights },
      `saved ${cfg.saveWeights} (Hugging Face's GPT-2 layout)`,
    );
  }
  trainer.dispose();
  optimizer.dispose();
  return { before, trained };
}
