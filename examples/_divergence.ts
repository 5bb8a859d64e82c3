/**
 * Telling a diverged run from a healthy one at the points where the examples
 * already wait for the GPU (a logged loss, the end of an epoch), so a run
 * that went to NaN stops with one clear line instead of saving NaN weights
 * over the last good file. Diverged means: in f32, a non-finite loss or
 * weights; under AMP (where a non-finite batch is skipped on purpose), every
 * optimizer step since the last check skipped with the loss scale static or
 * already at its floor, or non-finite master weights.
 *
 * @module
 */
import { addInPlace, type AmpTrainer, noGrad, sum, Tensor, tidy } from "../mod.ts";

/** What a check found: why the run diverged, or a warning, or neither. */
export interface Health {
  /** Why training cannot go on (with the flag to change), or null. */
  diverged: string | null;
  /** Something the user should know (most steps skipped), or null. */
  warning: string | null;
}

/** A share of skipped steps above which a check warns (dynamic scaling skips a few at first). */
const SKIPPED_SHARE_WARNING = 0.5;

/** Watches one trainer's losses, weights and skipped steps between checks. */
export class DivergenceWatch {
  #stepsBefore: number;
  #skippedBefore: number;

  private constructor(readonly trainer: AmpTrainer, skipped: number) {
    this.#stepsBefore = trainer.steps;
    this.#skippedBefore = skipped;
  }

  /** A watch from the trainer's present state (reads its skip count once: a sync). */
  static async start(trainer: AmpTrainer): Promise<DivergenceWatch> {
    return new DivergenceWatch(trainer, await trainer.scaler.skippedSteps());
  }

  /** Whether the trainer scales the loss (AMP with f16): non-finite steps are then skipped. */
  get amp(): boolean {
    return this.trainer.scaler.enabled;
  }

  /**
   * Checks the mean `loss` since the last check and, with `weights`, that
   * every weight is finite (one sum on the GPU and one read). Reads the
   * scaler under AMP. Call it only where the script already waits for the GPU.
   */
  async check(loss: number, weights: Tensor[] | null): Promise<Health> {
    const steps = this.trainer.steps - this.#stepsBefore;
    this.#stepsBefore = this.trainer.steps;
    if (!this.amp && !Number.isFinite(loss)) {
      return { diverged: `the training loss is ${loss}: lower --lr`, warning: null };
    }
    if (weights && !(await allFinite(weights))) {
      return { diverged: "the weights hold inf or NaN: lower --lr", warning: null };
    }
    if (!this.amp || steps === 0) return { diverged: null, warning: null };
    const state = await this.trainer.scaler.stateDict();
    const skipped = state.skippedSteps - this.#skippedBefore;
    this.#skippedBefore = state.skippedSteps;
    const fixed = state.options.lossScale !== 0;
    const advice = fixed
      ? `lower --loss-scale ${state.scale} (0 is dynamic scaling)`
      : "lower --lr (the dynamic scale cannot go lower)";
    const what = `${skipped} of ${steps} optimizer steps skipped (inf/NaN gradients at loss ` +
      `scale ${state.scale})`;
    if (skipped === steps && (fixed || state.scale <= state.options.minScale)) {
      return { diverged: `${what}: ${advice}`, warning: null };
    }
    if (skipped > steps * SKIPPED_SHARE_WARNING) {
      return { diverged: null, warning: `${what}; ${fixed ? advice : "check --lr"}` };
    }
    return { diverged: null, warning: null };
  }
}

/** Whether every value of `tensors` is finite: their sum on the GPU, one read. */
async function allFinite(tensors: Tensor[]): Promise<boolean> {
  const total = noGrad(() =>
    tidy(() => {
      const t = Tensor.zeros([]);
      for (const x of tensors) addInPlace(t, sum(x));
      return t;
    })
  );
  const value = await total.item();
  total.dispose();
  return Number.isFinite(value);
}
