/**
 * Learning-rate schedules as pure functions of the step number, and a small
 * scheduler that applies one to an optimizer's parameter groups. Everything
 * here runs on the CPU: a new learning rate is just a different uniform word
 * in the next fused update, so scheduling costs no GPU work and no sync.
 */
import { fail, ValueError } from "../gpu/mod.ts";

/** A schedule: the factor in [0, 1] the base learning rate is multiplied by at `step` (0, 1, 2, ...). */
export type LrSchedule = (step: number) => number;

/**
 * What a schedule made by {@link cosineSchedule} or {@link linearWarmupDecay}
 * is, saved with the scheduler's state so that another program (PyTorch's
 * `LambdaLR` in `examples/torch/`) can go on with the same learning rates.
 */
export interface LrScheduleDescription {
  /** Which shape: the half cosine or the linear decay, each after a linear warmup. */
  name: "cosine" | "linear";
  /** Steps of linear warmup. */
  warmupSteps: number;
  /** The step at which the decay reaches `minFactor`. */
  totalSteps: number;
  /** The factor at and after `totalSteps`. */
  minFactor: number;
}

/** The descriptions of the schedules this file made (a schedule is a plain function). */
const descriptions = new WeakMap<LrSchedule, LrScheduleDescription>();

/** `schedule`, remembered as `description`. */
function described(schedule: LrSchedule, description: LrScheduleDescription): LrSchedule {
  descriptions.set(schedule, description);
  return schedule;
}

/** Options of {@link linearWarmupDecay}. */
export interface LinearWarmupDecayOptions {
  /** Steps of linear warmup from 0 to 1 (0: none). */
  warmupSteps: number;
  /** The step at which the decay reaches `minFactor` (and stays). */
  totalSteps: number;
  /** The factor at and after `totalSteps` (default 0). */
  minFactor?: number;
}

/** Options of {@link cosineSchedule}. */
export interface CosineScheduleOptions {
  /** Steps of linear warmup from 0 to 1 (default 0). */
  warmupSteps?: number;
  /** The step at which the cosine reaches `minFactor` (and stays). */
  totalSteps: number;
  /** The factor at and after `totalSteps` (default 0). */
  minFactor?: number;
}

function checkOptions(name: string, warmup: number, total: number, minFactor: number): void {
  if (!Number.isInteger(warmup) || warmup < 0) {
    throw new ValueError(`${name}: warmupSteps must be an integer >= 0, got ${warmup}.`);
  }
  if (!Number.isInteger(total) || total < 1 || total < warmup) {
    throw new ValueError(
      `${name}: totalSteps must be an integer >= 1 and >= warmupSteps (${warmup}), got ${total}.`,
    );
  }
  if (!(minFactor >= 0 && minFactor <= 1)) {
    throw new ValueError(`${name}: minFactor must be in [0, 1], got ${minFactor}.`);
  }
}

function checkStep(name: string, step: number): void {
  if (!(step >= 0) || !Number.isFinite(step)) {
    throw new ValueError(`${name}: step must be a finite number >= 0, got ${step}.`);
  }
}

/**
 * Linear warmup then linear decay (the BERT / Hugging Face
 * `get_linear_schedule_with_warmup` schedule, plus an optional floor):
 * step/warmupSteps while warming up, then falling linearly from 1 at
 * `warmupSteps` to `minFactor` at `totalSteps`, and `minFactor` after.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { linearWarmupDecay } from "../mod.ts";
 * const f = linearWarmupDecay({ warmupSteps: 100, totalSteps: 1000 });
 * assert.equal(f(50), 0.5);
 * assert.equal(f(100), 1); // warming up
 * assert.equal(f(550), 0.5);
 * assert.equal(f(1000), 0); // decaying
 * ```
 */
export function linearWarmupDecay(options: LinearWarmupDecayOptions): LrSchedule {
  const { warmupSteps, totalSteps, minFactor = 0 } = options;
  checkOptions("linearWarmupDecay", warmupSteps, totalSteps, minFactor);
  return described((step) => {
    checkStep("linearWarmupDecay", step);
    if (step < warmupSteps) return step / warmupSteps;
    if (step >= totalSteps) return minFactor;
    const remaining = (totalSteps - step) / (totalSteps - warmupSteps);
    return minFactor + (1 - minFactor) * remaining;
  }, { name: "linear", warmupSteps, totalSteps, minFactor });
}

/**
 * Linear warmup then a half cosine (Hugging Face
 * `get_cosine_schedule_with_warmup`, plus an optional floor): from 1 at
 * `warmupSteps` to `minFactor` at `totalSteps`, `minFactor` after.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { cosineSchedule } from "../mod.ts";
 * const f = cosineSchedule({ warmupSteps: 10, totalSteps: 110 });
 * assert.equal(f(5), 0.5);
 * assert.equal(f(10), 1);
 * assert.equal(f(110), 0);
 * assert.ok(Math.abs(f(60) - 0.5) < 1e-12, `f(60) = ${f(60)}`); // halfway down the cosine
 * ```
 */
export function cosineSchedule(options: CosineScheduleOptions): LrSchedule {
  const { warmupSteps = 0, totalSteps, minFactor = 0 } = options;
  checkOptions("cosineSchedule", warmupSteps, totalSteps, minFactor);
  return described((step) => {
    checkStep("cosineSchedule", step);
    if (step < warmupSteps) return step / warmupSteps;
    if (step >= totalSteps) return minFactor;
    const progress = (step - warmupSteps) / (totalSteps - warmupSteps);
    return minFactor + (1 - minFactor) * 0.5 * (1 + Math.cos(Math.PI * progress));
  }, { name: "cosine", warmupSteps, totalSteps, minFactor });
}

/** What {@link LrScheduler} drives: anything with parameter groups that have a settable `lr`. */
export interface LrGroups {
  /** The parameter groups; their `lr` is assigned on every scheduler step. */
  readonly groups: readonly { lr: number }[];
}

/**
 * Applies a schedule to an optimizer: remembers each group's learning rate
 * at construction as its base, sets lr = base × factor(0) at once, and on
 * every `.step()` sets lr = base × factor(number of `.step()` calls so far).
 * Call it once per optimizer step, after `optimizer.step()`.
 *
 * The count is of `.step()` calls, so AMP steps the GradScaler skipped still
 * advance the schedule (as in PyTorch, where the scheduler cannot know). To
 * schedule by applied updates instead, pass the step number yourself:
 * `scheduler.step(optimizerSteps - skippedSteps)`, with the skipped count
 * read from the scaler when you read it anyway (reading it is a sync).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AdamW, initGpu, linearWarmupDecay, LrScheduler, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const optimizer = new AdamW([Tensor.zeros([4], { requiresGrad: true })], { lr: 1e-3 });
 * const schedule = linearWarmupDecay({ warmupSteps: 100, totalSteps: 1000 });
 * const scheduler = new LrScheduler(optimizer, schedule);
 * for (let i = 0; i < 50; i++) {
 *   optimizer.step(); // after backward (a parameter without a gradient is left alone)
 *   scheduler.step();
 * }
 * // halfway through the warmup
 * assert.ok(Math.abs(scheduler.lrs[0] - 5e-4) < 1e-12, `lr ${scheduler.lrs[0]}`);
 * gpu.destroy();
 * ```
 */
export class LrScheduler {
  #optimizer: LrGroups;
  #schedule: LrSchedule;
  #baseLrs: readonly number[];
  #step = 0;

  /** A scheduler for `optimizer`'s groups (their current lr becomes the base). */
  constructor(optimizer: LrGroups, schedule: LrSchedule) {
    if (typeof schedule !== "function") {
      throw new ValueError("LrScheduler: schedule must be a function (step) => factor.");
    }
    this.#optimizer = optimizer;
    this.#schedule = schedule;
    this.#baseLrs = optimizer.groups.map((g) => g.lr);
    this.#apply();
  }

  /** Each group's learning rate when the scheduler was made (or as a loaded state says). */
  get baseLrs(): readonly number[] {
    return this.#baseLrs;
  }

  /** How many times `.step()` was called (or the step last passed to it). */
  get stepCount(): number {
    return this.#step;
  }

  /** The learning rates currently set, per group. */
  get lrs(): number[] {
    return this.#optimizer.groups.map((g) => g.lr);
  }

  /** Advances the schedule by one step, or jumps to `step` when given; sets every group's lr. */
  step(step?: number): void {
    if (step !== undefined && (!Number.isInteger(step) || step < 0)) {
      throw new ValueError(`LrScheduler.step: step must be an integer >= 0, got ${step}.`);
    }
    this.#step = step ?? this.#step + 1;
    this.#apply();
  }

  /**
   * The scheduler's state as plain data (base learning rates and step), so a
   * resumed run goes on with the same learning rates whatever order the
   * scheduler and the optimizer were restored in. A schedule made by
   * {@link cosineSchedule} or {@link linearWarmupDecay} is described too, so
   * another program can rebuild it (the live scheduler's own schedule is
   * what a load goes on with).
   *
   * @returns A JSON-safe copy.
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { cosineSchedule, LrScheduler } from "../mod.ts";
   * const optimizer = { groups: [{ lr: 0.1 }] };
   * const scheduler = new LrScheduler(optimizer, cosineSchedule({ totalSteps: 10 }));
   * scheduler.step();
   * const state = scheduler.stateDict();
   * const resumed = new LrScheduler({ groups: [{ lr: 0.5 }] }, cosineSchedule({ totalSteps: 10 }));
   * resumed.loadStateDict(state);
   * assert.equal(resumed.stepCount, 1);
   * assert.equal(resumed.lrs[0], scheduler.lrs[0]);
   * assert.equal(state.schedule?.name, "cosine");
   * assert.equal(state.schedule?.totalSteps, 10);
   * ```
   */
  stateDict(): LrSchedulerState {
    const schedule = descriptions.get(this.#schedule);
    return {
      baseLrs: [...this.#baseLrs],
      step: this.#step,
      ...(schedule && { schedule: { ...schedule } }),
    };
  }

  /**
   * Throws a ValueError unless `state` fits this scheduler (one base lr per
   * group, each finite and >= 0; a step the schedule gives a valid factor
   * for). Changes nothing.
   *
   * @param state A {@link stateDict} result, e.g. parsed from a file.
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { linearWarmupDecay, LrScheduler, ValueError } from "../mod.ts";
   * const scheduler = new LrScheduler({ groups: [{ lr: 0.1 }] }, linearWarmupDecay({ warmupSteps: 0, totalSteps: 9 }));
   * scheduler.checkStateDict({ baseLrs: [0.1], step: 3 }); // fits
   * // One base lr per group: a state of two groups does not fit.
   * assert.throws(() => scheduler.checkStateDict({ baseLrs: [0.1, 0.1], step: 3 }), ValueError);
   * ```
   */
  checkStateDict(state: LrSchedulerState): void {
    const where = "LrScheduler.loadStateDict";
    const groups = this.#optimizer.groups.length;
    const lrs = state?.baseLrs;
    if (
      !Array.isArray(lrs) || lrs.length !== groups ||
      !lrs.every((lr) => typeof lr === "number" && Number.isFinite(lr) && lr >= 0)
    ) {
      fail(ValueError, where, `baseLrs must be ${groups} finite number(s) >= 0, one per group.`);
    }
    const step = state.step;
    if (!Number.isSafeInteger(step) || step < 0) {
      fail(
        ValueError,
        where,
        `step must be an integer >= 0, got ${typeof step === "number" ? step : typeof step}.`,
      );
    }
    this.#factor(step);
  }

  /**
   * Restores a {@link stateDict} result (checked first, see
   * {@link checkStateDict}) and sets every group's lr from it.
   *
   * @param state The state to go on from.
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { linearWarmupDecay, LrScheduler } from "../mod.ts";
   * const optimizer = { groups: [{ lr: 1 }] };
   * const scheduler = new LrScheduler(optimizer, linearWarmupDecay({ warmupSteps: 4, totalSteps: 8 }));
   * scheduler.loadStateDict({ baseLrs: [0.2], step: 2 });
   * assert.equal(optimizer.groups[0].lr, 0.1);
   * ```
   */
  loadStateDict(state: LrSchedulerState): void {
    this.checkStateDict(state);
    this.#baseLrs = [...state.baseLrs];
    this.#step = state.step;
    this.#apply();
  }

  #factor(step: number): number {
    const factor = this.#schedule(step);
    if (!(factor >= 0) || !Number.isFinite(factor)) {
      throw new ValueError(
        `LrScheduler: the schedule returned ${factor} at step ${step}; factors must be finite and >= 0.`,
      );
    }
    return factor;
  }

  #apply(): void {
    const factor = this.#factor(this.#step);
    this.#optimizer.groups.forEach((g, i) => (g.lr = this.#baseLrs[i] * factor));
  }
}

/** What {@link LrScheduler.stateDict} returns: JSON-safe. */
export interface LrSchedulerState {
  /** Each group's base learning rate. */
  baseLrs: number[];
  /** The schedule's step. */
  step: number;
  /** What the schedule is, when {@link cosineSchedule} or {@link linearWarmupDecay} made it. */
  schedule?: LrScheduleDescription;
}
