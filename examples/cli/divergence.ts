/**
 * Telling a diverged run from a healthy one at the points where the examples
 * already wait for the GPU (a logged loss, the end of an epoch, an
 * evaluation), so a run that went to NaN stops with one clear line instead
 * of saving its weights over the last good file. Diverged means: a
 * non-finite evaluation loss or weights; in f32, a non-finite training loss;
 * under AMP (where a non-finite batch is skipped on purpose, so the training
 * loss alone says nothing), steps skipped with the dynamic loss scale
 * already at its floor, every step since the last check skipped at a static
 * scale, or the last {@link SKIPPED_STREAK} optimizer steps all skipped.
 * A healthy AMP run that skips a few steps (the dynamic scale's first
 * overflows, backing off from its initial 2^16, an odd overflow later) meets
 * none of these: the dynamic scale reaches its floor (1) only when the
 * gradients overflow f16 unscaled.
 *
 * @module
 */
import { addInPlace, type AmpTrainer, noGrad, sum, Tensor, tidy } from "../../mod.ts";

/** What a check found: why the run diverged, or a warning, or neither. */
export interface Health {
  /** Why training cannot go on (with the flag to change), or null. */
  diverged: string | null;
  /** Something the user should know (most steps skipped), or null. */
  warning: string | null;
}

/** A share of skipped steps above which a check warns (dynamic scaling skips a few at first). */
const SKIPPED_SHARE_WARNING = 0.5;
/**
 * Optimizer steps skipped in a row that count as divergence whatever the
 * scale: more than the dynamic scale's fall from its ceiling (2^24) to its
 * floor (1) takes at one halving a skip, so a healthy dynamic run never gets here.
 */
export const SKIPPED_STREAK = 50;

/** Watches one trainer's losses, weights and skipped steps between checks. */
export class DivergenceWatch {
  #stepsBefore: number;
  #skippedBefore: number;
  /** Steps skipped in a row up to the last check (counted whole intervals at a time). */
  #streak = 0;

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
    this.#streak = skipped === steps ? this.#streak + steps : 0;
    const fixed = state.options.lossScale !== 0;
    const floor = !fixed && state.scale <= state.options.minScale;
    const advice = fixed
      ? `lower --loss-scale ${state.scale} (0 is dynamic scaling) or --lr`
      : floor
      ? "lower --lr (the dynamic scale is at its floor)"
      : "lower --lr";
    const what = `${skipped} of ${steps} optimizer steps skipped (inf/NaN gradients at loss ` +
      `scale ${state.scale})`;
    const allSkipped = skipped === steps && (fixed || this.#streak >= SKIPPED_STREAK);
    if (allSkipped || (floor && skipped > 0)) {
      return { diverged: `${what}: ${advice}`, warning: null };
    }
    if (skipped > steps * SKIPPED_SHARE_WARNING) {
      return { diverged: null, warning: `${what}; ${fixed ? advice : "check --lr"}` };
    }
    return { diverged: null, warning: null };
  }
}

/**
 * What a finished evaluation's mean loss says: diverged when it is not
 * finite (whatever the precision: the weights themselves are broken), with
 * the flags to change.
 */
export function evaluationHealth(loss: number, trainer: AmpTrainer): Health {
  if (Number.isFinite(loss)) return { diverged: null, warning: null };
  const scale = trainer.scaler.enabled ? " (or the --loss-scale)" : "";
  return { diverged: `the evaluation loss is ${loss}: lower --lr${scale}`, warning: null };
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
