/**
 * What `mnist.ts` keeps in a saved training state besides the model,
 * optimizer, trainer and schedule (the `extra` of `saveTrainingState`): its
 * run record ({@link MNIST_RUN} tells `runs/run_file.ts`'s checks before
 * start-up how to read it), the resume that reads it back, and the check of
 * flags that differ from the saved run's.
 *
 * The record is what continuing needs, written so that another program
 * (`examples/torch/continue_ddp.py`) can go on with the same run: the epochs
 * finished and the steps taken, the data order's generator (seed and offset
 * before the epoch in progress drew its order) and how many steps into that
 * epoch the run is, and the flags (batch, images, seed, ...). The
 * schedule's step is the scheduler's own state in the same file.
 *
 * @module
 */
import { RandomGenerator } from "../../mod.ts";
import { loadTrainingState } from "../../files.ts";
import {
  checkResumeFlags,
  describeChanges,
  type FlagChange,
  type FlagValues,
} from "../cli/resume_flags.ts";
import { orExit } from "../cli/flags.ts";
import type { RunRecordKind } from "../runs/run_file.ts";
import type { PlotPoint } from "../plots/loss_chart.ts";
import { checkRun, type MnistArgs } from "./args.ts";
import type { Run } from "./run.ts";

/** The run record `mnist.ts` saves as the training state's `extra`. */
export interface RunRecord {
  /** Epochs finished. */
  epoch: number;
  /** Training steps (micro-batches) taken. */
  step: number;
  /** The data order's generator before the epoch in progress drew its order. */
  shuffler: { seed: number; offset: number };
  /** Steps into the epoch in progress (0 at an epoch's end; older files lack it). */
  position?: number;
  /** The flags that shape the run and those that steer it. */
  flags?: { shape: FlagValues; steering: FlagValues };
  /** Files written before the flags were recorded: the shape, with `trainCount` for `limit`. */
  run?: FlagValues;
  /** The loss chart's points so far. */
  plotPoints?: PlotPoint[];
}

/** The flags a saved training state records (see `checkResumeFlags`). */
export function runFlags(
  cfg: MnistArgs,
  trainCount: number,
  batch: number,
): { shape: FlagValues; steering: FlagValues } {
  const shape: FlagValues = {
    model: cfg.model,
    shift: cfg.shift,
    optimizer: cfg.optimizer,
    // The optimizer's state layout: a file of 8-bit moments resumes only with 8-bit ones.
    "optim-states": cfg.optimStates,
    schedule: cfg.schedule,
    epochs: cfg.epochs, // the schedule spans them
    limit: trainCount,
    batch,
    accum: cfg.accum,
    amp: cfg.amp && cfg.ampDtype === "bf16" ? "bf16" : cfg.amp, // true: f16, as before bf16
    seed: cfg.seed,
  };
  // The optimizer's state restores momentum, so it cannot be overridden.
  if (cfg.optimizer === "sgd") shape.momentum = cfg.momentum;
  const steering: FlagValues = { lr: cfg.lr };
  if (cfg.amp && cfg.ampDtype === "f16") steering["loss-scale"] = cfg.lossScale;
  return { shape, steering };
}

/** The saved flags of `record` (older files recorded the shape alone, under another name). */
export function savedFlags(record: RunRecord): { shape?: FlagValues; steering?: FlagValues } {
  if (record.flags) return record.flags;
  if (!record.run) return {};
  const { trainCount, ...rest } = record.run;
  return { shape: { ...rest, limit: trainCount } };
}

/** mnist.ts's run record in a parsed `extra`, or null when it is not one. */
function recordOf(extra: unknown): RunRecord | null {
  const r = extra as RunRecord | null;
  const count = (x: unknown) => Number.isSafeInteger(x) && (x as number) >= 0;
  const ok = typeof r === "object" && r !== null && count(r.epoch) && count(r.step) &&
    typeof r.shuffler === "object" && r.shuffler !== null && count(r.shuffler.seed) &&
    count(r.shuffler.offset) && (r.position === undefined || count(r.position));
  return ok ? r : null;
}

/** What mnist.ts keeps in a training state, for the checks before start-up (`runs/run_file.ts`). */
export const MNIST_RUN: RunRecordKind<RunRecord> = {
  script: "mnist.ts",
  holds: "epoch, step, data order",
  recordOf,
  describe: (r) => `epoch ${r.epoch}, step ${r.step}`,
  replaced: "after the first good epoch",
};

/** Where a run goes on from: the epoch in progress, the steps taken, and the steps into it. */
export interface Start {
  epoch: number;
  step: number;
  /** Steps of `epoch` already taken (a run continued elsewhere may stop mid-epoch). */
  position: number;
  plotPoints: PlotPoint[];
}

/**
 * Restores the run saved in `--resume` (model, optimizer, trainer, schedule
 * and data order; `record` and the flag `changes` were checked before
 * start-up) and returns where to go on from; without `--resume`, epoch 1,
 * step 0. Exits with status 1, in one line, when the file does not fit.
 */
export async function resumeOrStart(
  run: Run,
  record: RunRecord | null,
  changes: FlagChange[],
): Promise<Start> {
  const { cfg, model, optimizer, trainer } = run;
  if (!cfg.resume || !record) return { epoch: 1, step: 0, position: 0, plotPoints: [] };
  await loadTrainingState(cfg.resume, { model, optimizer, trainer }).catch((e) => {
    console.error(`mnist: cannot resume: ${e instanceof Error ? e.message : e}`);
    run.gpu.destroy();
    Deno.exit(1);
  });
  if (changes.length > 0) {
    // The new lr reaches the optimizer through the scheduler (its base is --lr); the scaler
    // was restored from the file, so a new --loss-scale is set here.
    if (changes.some((c) => c.flag === "loss-scale")) {
      const state = await trainer.scaler.stateDict();
      trainer.scaler.loadStateDict({
        ...state,
        scale: cfg.lossScale || state.scale,
        options: { ...state.options, lossScale: cfg.lossScale },
      });
    }
    run.emit(
      "override",
      { changes },
      `--override: resuming ${cfg.resume} with ${describeChanges(changes)}`,
    );
  }
  run.scheduler.step(trainer.steps); // the restored optimizer carries the lr it was saved with
  run.shuffler = new RandomGenerator(record.shuffler.seed, record.shuffler.offset);
  const position = record.position ?? 0;
  const finished = record.epoch >= cfg.epochs;
  const where = position > 0
    ? `${position} steps into epoch ${record.epoch + 1}`
    : `after epoch ${record.epoch}`;
  run.emit(
    "resume",
    { path: cfg.resume, epoch: record.epoch, step: record.step, position, finished },
    finished
      ? `${cfg.resume} holds a finished run (${record.epoch} of ${cfg.epochs} epochs, step ` +
        `${record.step}): nothing left to train; evaluating it`
      : `resumed ${cfg.resume} ${where} (step ${record.step})`,
  );
  return {
    epoch: record.epoch + 1,
    step: record.step,
    position,
    plotPoints: record.plotPoints ?? [],
  };
}

/**
 * What can be checked before start-up, in one line and exit status 2: the
 * flags against the data (see `checkRun`) and a resumed run's flags against the saved ones (the changes
 * `--override` accepts are returned, to apply and print).
 */
export function checkBeforeStart(
  cfg: MnistArgs,
  trainCount: number,
  batch: number,
  record: RunRecord | null,
): FlagChange[] {
  try {
    checkRun(cfg, trainCount);
  } catch (e) {
    console.error(`mnist: ${e instanceof Error ? e.message : e} (see --help)`);
    Deno.exit(2);
  }
  if (!record) return [];
  const given = runFlags(cfg, trainCount, batch);
  return orExit(
    "mnist",
    () => checkResumeFlags(cfg.resume!, savedFlags(record), given, cfg.override),
  );
}
