/**
 * The whole AMP step in one call, in the spirit of apex's `amp.initialize`
 * and Paddle's `decorate`: autocast forward, loss scaling, gradient
 * accumulation over micro-batches, unscale + inf/NaN check, clipping by
 * global norm, the fused optimizer step (skipped on the GPU on overflow) and
 * the scale update. Nothing in it reads back to the CPU.
 */
import {
  checkOptionNames,
  DTypeError,
  fail,
  getGpu,
  type GradNode,
  type HalfstepErrorClass,
  scale,
  ShapeError,
  shortValue,
  StateError,
  type Tensor,
  tidy,
  ValueError,
  warnOnce,
} from "../gpu/mod.ts";
import { clipGradNorm } from "../optim/clip.ts";
import type { Optimizer } from "../optim/optimizer.ts";
import { type AmpDType, ampDType } from "./amp_dtype.ts";
import { autocast } from "./autocast.ts";
import { GradScaler, type GradScalerOptions, type GradScalerState } from "./grad_scaler.ts";
import { MasterWeights } from "./master_weights.ts";
import type { NumericsInspector } from "./numerics_inspector.ts";
import type { AutocastLists } from "./policy.ts";
import { CapturedStep, type CaptureOptions } from "./captured_step.ts";
import type { HasParameters } from "./has_parameters.ts";

/**
 * What makes `loss` unfit for a step, from shapes alone (no GPU read): not a
 * scalar, or computed from an empty batch — a tensor with no elements in its
 * graph — whose NaN mean would give zero gradients and an unskipped step.
 */
function lossProblem(loss: Tensor): { kind: HalfstepErrorClass; what: string } | null {
  if (loss.size !== 1) {
    return {
      kind: ShapeError,
      what: `the loss must be a scalar, got ${loss.describe()}; reduce it with mean() or sum().`,
    };
  }
  // An empty batch shows where the loss reduces an empty tensor: follow only the scalar
  // chain above the reductions (a sum of losses, a scaled loss), never the whole graph, so
  // an empty piece elsewhere (a split that gives one branch no rows) is not mistaken for it.
  const seen = new Set<GradNode>();
  const stack = loss.gradFn ? [loss.gradFn] : [];
  while (stack.length > 0) {
    const node = stack.pop()!;
    const empty = node.inputs.find((t) => t.size === 0);
    if (empty) {
      return {
        kind: ValueError,
        what: `the loss comes from an empty batch (${node.op} of ${empty.describe()}); ` +
          "skip batches with no rows.",
      };
    }
    for (const { gradFn, size } of node.inputs) {
      if (gradFn && size === 1 && !seen.has(gradFn)) {
        seen.add(gradFn);
        stack.push(gradFn);
      }
    }
  }
  return null;
}

/** Options of {@link AmpTrainer}. */
export interface AmpTrainerOptions {
  /**
   * Run autocast (with loss scaling for f16) (default true); false trains in
   * plain f32. Without shader-f16, f16 is f32 with loss scaling off either way.
   */
  enabled?: boolean;
  /**
   * The low-precision dtype: "f16" (default) or "bf16" (fp32 masters write
   * bf16 working copies; loss scaling off by default, since bf16 has f32's
   * range, as PyTorch needs no GradScaler for bf16; needs no shader-f16).
   */
  dtype?: AmpDType;
  /** apex's `--loss_scale`: 0 = dynamic (default), a power of two = static. */
  lossScale?: number;
  /** Micro-batches per optimizer step (default 1). */
  accumulationSteps?: number;
  /** Clip gradients to this global L2 norm (default: no clipping). */
  maxGradNorm?: number;
  /** Autocast op lists (default: the standard ones). */
  lists?: AutocastLists;
  /**
   * Further GradScaler options (growth interval, hysteresis, ...). Its
   * `enabled` defaults to whether f16 runs: without shader-f16 (or with
   * `initGpu({ f16: "off" })`) f16 training is f32 and loss scaling is off, as
   * PyTorch's GradScaler turns itself off where autocast cannot run, and
   * bf16 training has it off (a scale of 1, no step skipped); give
   * `enabled: true` to scale anyway.
   */
  scaler?: Omit<GradScalerOptions, "lossScale" | "gpu">;
  /**
   * Watches every micro-batch's forward and backward (not the optimizer
   * step) with this inspector, under the trainer's scaler.
   */
  inspector?: NumericsInspector;
  /**
   * The dtype the fp32 masters' gradients are kept in: "f32" (default) or
   * the AMP dtype itself ("f16" under f16, "bf16" under bf16), apex O2's
   * half-precision gradients: products write the weight gradients in it from
   * their f32 accumulators (2 bytes a parameter instead of 4), the scaler
   * checks them for inf/NaN without unscaling them in place (which would
   * flush small f16 values to zero), clipping takes their norm in f32 times
   * 1/scale, and the fused optimizer multiplies them by 1/scale × the clip
   * coefficient as it reads them. With `accumulationSteps` above 1 the
   * gradients are accumulated in f32 as always (one f16 rounding per
   * micro-batch would add up): {@link AmpTrainer.gradDtype} then says "f32".
   * Where AMP does not run (disabled, or f16 without shader-f16) gradients
   * are f32 too.
   */
  gradDtype?: GradDType;
}

/** What the masters' gradients can be kept in: f32, or the trainer's AMP dtype. */
export type GradDType = "f32" | AmpDType;

/** Every option of {@link AmpTrainerOptions} (a new one fails the type check until listed). */
const TRAINER_OPTIONS: Record<keyof AmpTrainerOptions, true> = {
  enabled: true,
  dtype: true,
  lossScale: true,
  accumulationSteps: true,
  maxGradNorm: true,
  lists: true,
  scaler: true,
  inspector: true,
  gradDtype: true,
};

export type { HasParameters } from "./has_parameters.ts";

/** What {@link AmpTrainer.stateDict} saves besides the model and optimizer. */
export interface AmpTrainerState {
  /** The scaler's state. */
  scaler: GradScalerState;
  /** Micro-batches since the last optimizer step. */
  microStep: number;
  /** Optimizer steps run (including skipped ones). */
  steps: number;
  /**
   * What the trainer that saved it computed in: its low-precision dtype, or
   * "f32" when it was disabled. Absent in states saved before bf16 existed
   * and in ones PyTorch wrote: not checked then.
   */
  dtype?: TrainerPrecision;
}

/** What a trainer computes in, as its saved state records it: its AMP dtype, or "f32" when disabled. */
export type TrainerPrecision = AmpDType | "f32";
const PRECISIONS: readonly TrainerPrecision[] = ["f16", "bf16", "f32"];

/**
 * Drives mixed-precision training of `model` with `optimizer`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AdamW, crossEntropy, initGpu, Linear, ReLU, Sequential, Tensor } from "../mod.ts";
 * const gpu = await initGpu();
 * const model = new Sequential(new Linear(4, 8, { seed: 1 }), new ReLU(), new Linear(8, 2, { seed: 2 }));
 * const trainer = new AmpTrainer(model, new AdamW(model.parameters(), { lr: 1e-2 }), {
 *   accumulationSteps: 2,
 *   maxGradNorm: 1,
 * });
 * const x = Tensor.from([1, 2, 3, 4, 4, 3, 2, 1], [2, 4]);
 * for (let i = 0; i < 4; i++) {
 *   const loss = trainer.step(() => crossEntropy(model.forward(x), [0, 1]));
 *   loss.dispose(); // read it (a sync) only when logging
 * }
 * assert.equal(trainer.steps, 2); // two micro-batches per optimizer step
 * trainer.dispose();
 * // bf16: fp32 masters write bf16 working copies, no loss scaling, no shader-f16 needed
 * const bf16 = new AmpTrainer(model, new AdamW(model.parameters()), { dtype: "bf16" });
 * assert.equal(bf16.masters!.dtype, "bf16");
 * assert.ok(!bf16.scaler.enabled);
 * bf16.dispose();
 * gpu.destroy();
 * ```
 */
export class AmpTrainer {
  /** The loss scaler (its scale and skip counts can be read, as sync points). */
  readonly scaler: GradScaler;
  /**
   * The working copies of the parameters, in {@link AmpTrainer.dtype} (none
   * when disabled, or for f16 without shader-f16).
   */
  readonly masters: MasterWeights | null;
  /** The low-precision dtype autocast runs in (whether or not it runs). */
  readonly dtype: AmpDType;
  /** Micro-batches per optimizer step. */
  readonly accumulationSteps: number;
  /**
   * The dtype the masters' gradients are kept in: the `gradDtype` option
   * where it applies, else "f32" (see {@link AmpTrainerOptions.gradDtype}).
   */
  readonly gradDtype: GradDType;
  #halfGrads: Tensor[] = [];
  #model: HasParameters;
  #optimizer: Optimizer;
  #options: AmpTrainerOptions;
  #enabled: boolean;
  #microStep = 0;
  #steps = 0;
  #captures = new Set<CapturedStep>();

  /** Sets up master weights, the scaler and autocast for `model` and `optimizer`. */
  constructor(model: HasParameters, optimizer: Optimizer, options: AmpTrainerOptions = {}) {
    // A typo (`lossscale`) would otherwise train with the default silently, as initGpu refuses.
    checkOptionNames("AmpTrainer", options, Object.keys(TRAINER_OPTIONS), "check the spelling.");
    const accumulation = options.accumulationSteps ?? 1;
    if (!Number.isInteger(accumulation) || accumulation < 1) {
      fail(
        ValueError,
        "AmpTrainer",
        `accumulationSteps must be a positive integer, got ${accumulation}.`,
      );
    }
    if (options.maxGradNorm !== undefined && !(options.maxGradNorm > 0)) {
      fail(ValueError, "AmpTrainer", `maxGradNorm must be positive, got ${options.maxGradNorm}.`);
    }
    if (options.inspector && options.inspector.model !== model) {
      fail(
        ValueError,
        "AmpTrainer",
        "options.inspector watches another model; make it with new NumericsInspector(model).",
      );
    }
    const enabled = this.#enabled = options.enabled ?? true;
    const dtype = this.dtype = ampDType("AmpTrainer", options.dtype);
    this.#model = model;
    this.#optimizer = optimizer;
    this.#options = options;
    this.accumulationSteps = accumulation;
    const params = model.parameters();
    const gpu = params[0]?.gpu ?? getGpu();
    const runs = enabled && (gpu.f16 || dtype === "bf16");
    this.masters = runs ? new MasterWeights(params, { dtype }) : null;
    if (this.masters) optimizer.setWorkingCopies(this.masters);
    if (enabled && !runs && options.scaler?.enabled === undefined) {
      warnOnce(
        "AmpTrainer: the adapter has no shader-f16 (or f16 is off), so training runs in f32 " +
          'with loss scaling off (scale 1, no step skipped); dtype: "bf16" needs no shader-f16.',
      );
    }
    this.scaler = new GradScaler({
      ...options.scaler,
      lossScale: options.lossScale ?? 0,
      enabled: options.scaler?.enabled ?? (runs && dtype === "f16"),
      gpu,
    });
    const asked = options.gradDtype ?? "f32";
    if (asked !== "f32" && asked !== dtype) {
      fail(
        DTypeError,
        "AmpTrainer",
        `gradDtype ${shortValue(asked)} does not fit dtype "${dtype}": master gradients are ` +
          `kept in "f32" or in the AMP dtype itself; use gradDtype "${dtype}" or "f32".`,
      );
    }
    this.gradDtype = asked !== "f32" && this.masters && accumulation === 1 ? asked : "f32";
    if (this.gradDtype !== "f32") {
      this.#halfGrads = this.masters!.masters;
      for (const p of this.#halfGrads) {
        if (p.grad && p.grad.dtype !== this.gradDtype) {
          fail(
            StateError,
            "AmpTrainer",
            `parameter ${p.describe()} holds a gradient ${p.grad.describe()}; zero the ` +
              `gradients before making a trainer with gradDtype "${this.gradDtype}".`,
          );
        }
      }
      for (const p of this.#halfGrads) p.gradDtype = this.gradDtype;
    }
  }

  /** Optimizer steps run so far (skipped ones included). */
  get steps(): number {
    return this.#steps;
  }

  /**
   * Runs one micro-batch: `computeLoss` under autocast (its intermediates are
   * freed), then the scaled backward (the loss divided by the accumulation
   * count). After the last micro-batch of an effective batch it unscales and
   * checks the gradients, clips them, steps the optimizer (skipped on the
   * GPU on overflow), updates the scale and zeroes the gradients. Returns the
   * unscaled loss; dispose it (reading it is a sync point).
   */
  step(computeLoss: () => Tensor): Tensor {
    const inspector = this.#options.inspector;
    const loss = inspector
      ? inspector.watch(() => this.#microBatch(computeLoss), { scaler: this.scaler })
      : this.#microBatch(computeLoss);
    if (++this.#microStep === this.accumulationSteps) this.#finishStep();
    return loss;
  }

  /**
   * The step `computeLoss` makes, captured: `step.run(...inputs)` does what
   * `trainer.step(() => computeLoss(...inputs))` does, and after its first
   * cycles (recorded as they run, and checked to agree) replays them: no
   * autograd, no tensors, no pool traffic in JavaScript, a pass of recorded
   * dispatches. The inputs are copied into the step's own buffers; another
   * shape, a module's setting changed, a parameter frozen or the tuner's
   * picks changing capture it again (told in one line); a step that reads
   * the GPU or does different work every time is refused in one line. See
   * `CapturedStep`. Dispose the step (or the trainer) to free what it keeps.
   *
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { AdamW, crossEntropy, initGpu, Linear, Tensor } from "../mod.ts";
   * const gpu = await initGpu({ matmulTiling: "default" });
   * const model = new Linear(4, 3, { seed: 1 });
   * const trainer = new AmpTrainer(model, new AdamW(model.parameters()));
   * const step = trainer.capture((x, y) => crossEntropy(model.forward(x), y));
   * const x = Tensor.from([1, 2, 3, 4, 4, 3, 2, 1], [2, 4]);
   * const y = Tensor.from([0, 2], [2], { dtype: "i32" });
   * for (let i = 0; i < 5; i++) step.run(x, y).dispose();
   * assert.ok(step.captured);
   * assert.equal(trainer.steps, 5);
   * trainer.dispose(); // its captured steps too
   * gpu.destroy();
   * ```
   */
  capture(
    computeLoss: (...inputs: Tensor[]) => Tensor,
    options: CaptureOptions = {},
  ): CapturedStep {
    if (this.#options.inspector) {
      fail(
        StateError,
        "AmpTrainer.capture",
        "a trainer with a NumericsInspector cannot capture its step (the inspector watches " +
          "every op as it is recorded); train uncaptured to inspect",
      );
    }
    const params = this.#model.parameters();
    const step = new CapturedStep(
      {
        gpu: params[0]?.gpu ?? getGpu(),
        model: this.#model,
        optimizer: this.#optimizer,
        accumulationSteps: this.accumulationSteps,
        microStep: () => this.#microStep,
        step: (fn) => this.step(fn),
        advance: () => {
          if (++this.#microStep === this.accumulationSteps) {
            this.#microStep = 0;
            this.#steps++;
          }
        },
        forget: (s) => this.#captures.delete(s),
      },
      computeLoss,
      options,
    );
    this.#captures.add(step);
    return step;
  }

  /** Forward under autocast and the scaled backward of one micro-batch; returns the loss. */
  #microBatch(computeLoss: () => Tensor): Tensor {
    const loss = tidy(() => this.autocast(computeLoss));
    const problem = lossProblem(loss);
    if (problem) {
      loss.dispose(); // drops its graph too: nothing of this micro-batch is kept
      fail(problem.kind, "AmpTrainer.step", problem.what);
    }
    const scaled = tidy(() => {
      const divided = this.accumulationSteps === 1 ? loss : scale(loss, 1 / this.accumulationSteps);
      return this.scaler.scale(divided);
    });
    scaled.backward();
    if (scaled !== loss) scaled.dispose(); // a disabled scaler hands the loss back as it is
    return loss;
  }

  /**
   * Runs `fn` under this trainer's autocast: its lists, reading the working
   * copies of its master weights (plain f32 when AMP is off). Use it for
   * evaluation with the trainer's precision.
   */
  autocast<T>(fn: () => T): T {
    return autocast(fn, {
      enabled: this.masters !== null,
      dtype: this.dtype,
      lists: this.#options.lists,
      masterWeights: this.masters,
    });
  }

  #finishStep(): void {
    const optimizer = this.#optimizer;
    let coefficient: Tensor | undefined;
    // Half-precision gradients stay scaled: checked here, unscaled as the fused update reads them.
    const deferred = this.gradDtype !== "f32" && this.scaler.enabled;
    this.scaler.unscale(optimizer, { inPlace: !deferred });
    if (this.#options.maxGradNorm !== undefined) {
      const clip = clipGradNorm(this.#model.parameters(), this.#options.maxGradNorm, {
        inPlace: false,
        ...(deferred ? { gradScale: this.scaler.inverseScale } : {}),
      });
      clip.totalNorm.dispose();
      coefficient = clip.coefficient;
    }
    this.scaler.step(optimizer, { gradScale: coefficient });
    this.scaler.update();
    coefficient?.dispose();
    optimizer.zeroGrad();
    this.#microStep = 0;
    this.#steps++;
  }

  /** The trainer's own state (scaler and counters). A sync point (reads the scaler). */
  async stateDict(): Promise<AmpTrainerState> {
    return {
      scaler: await this.scaler.stateDict(),
      microStep: this.#microStep,
      steps: this.#steps,
      dtype: this.#precision(),
    };
  }

  /**
   * Throws a ValueError naming the first field of `state` this trainer
   * cannot load (counters' types and ranges, the scaler's fields); changes
   * nothing.
   */
  checkStateDict(state: AmpTrainerState): void {
    const where = "AmpTrainer.loadStateDict";
    if (typeof state !== "object" || state === null) {
      fail(ValueError, where, "state must be an object from stateDict().");
    }
    const shown = (v: unknown) => typeof v === "number" ? v : typeof v;
    const { microStep, steps } = state;
    if (!Number.isInteger(microStep) || microStep < 0 || microStep >= this.accumulationSteps) {
      fail(
        ValueError,
        where,
        `microStep ${shown(microStep)} is outside [0, ${this.accumulationSteps}).`,
      );
    }
    if (!Number.isSafeInteger(steps) || steps < 0) {
      fail(ValueError, where, `steps must be an integer >= 0, got ${shown(steps)}.`);
    }
    // A bf16 run resumed by an f16 trainer (or an f32 one) would go on in
    // another precision, with or without loss scaling, without a word.
    const { dtype } = state;
    if (dtype !== undefined && !PRECISIONS.includes(dtype)) {
      fail(
        ValueError,
        where,
        `dtype must be "f16", "bf16" or "f32" (or absent), got ${shown(dtype)}.`,
      );
    }
    const live = this.#precision();
    if (dtype !== undefined && dtype !== live) {
      const named = (d: TrainerPrecision) => d === "f32" ? "f32 (AMP off)" : d;
      const option = dtype === "f32"
        ? "{ enabled: false } (examples: no --amp)"
        : `{ ${
          this.#enabled ? "" : "enabled: true, "
        }dtype: "${dtype}" } (examples: --amp ${dtype})`;
      const why = `the run was saved in ${named(dtype)} and this trainer runs ${named(live)}`;
      fail(ValueError, where, `${why}: create it with ${option}.`);
    }
    this.scaler.checkStateDict(state.scaler);
  }

  /** What this trainer computes in, as its saved state records it. */
  #precision(): TrainerPrecision {
    return this.#enabled ? this.dtype : "f32";
  }

  /** Restores {@link stateDict} output; load the model and optimizer states yourself. */
  loadStateDict(state: AmpTrainerState): void {
    this.checkStateDict(state);
    this.scaler.loadStateDict(state.scaler);
    this.masters?.refresh();
    this.#microStep = state.microStep;
    this.#steps = state.steps;
  }

  /**
   * Frees the scaler's buffers, the working copies and the steps it
   * captured; masters that kept half-precision gradients go back to f32 ones.
   */
  dispose(): void {
    for (const p of this.#halfGrads) if (p.gradDtype === this.gradDtype) p.gradDtype = null;
    this.#halfGrads = [];
    for (const step of [...this.#captures]) step.dispose();
    this.scaler.dispose();
    this.masters?.dispose();
  }
}
