/**
 * What a resumed run may and may not change. A saved training state records
 * the flags it was trained with in groups: those that shape the run (the
 * model, the data order, the optimizer's kind and state layout), which a
 * resumed run must repeat; those that only steer it (learning rate, loss
 * scale), which `--override` may change — and then each change is printed,
 * so that no flag changes training silently; and its length (`--steps`),
 * which a resumed run may change freely, said in one line: a finished
 * fine-tune extended by 200 steps goes on into a schedule of the new total,
 * as Hugging Face's Trainer resumes into a longer `max_steps`.
 *
 * @module
 */
import { UsageError } from "./flags.ts";

/** Flag values by flag name (without `--`). */
export type FlagValues = Record<string, string | number | boolean>;

/** One flag whose given value differs from the saved one. */
export interface FlagChange {
  flag: string;
  saved: unknown;
  given: unknown;
}

/** The flags of `given` whose values differ from `saved` (a flag `saved` lacks counts as equal). */
export function flagChanges(saved: FlagValues | undefined, given: FlagValues): FlagChange[] {
  if (!saved) return [];
  return Object.keys(given)
    .filter((flag) => flag in saved && saved[flag] !== given[flag])
    .map((flag) => ({ flag, saved: saved[flag], given: given[flag] }));
}

/** `--lr 0.01 (saved: 0.002), --seed 1 (saved: 0)`: the given values, each beside the saved one. */
export function describeChanges(changes: FlagChange[]): string {
  return changes.map((c) => `--${c.flag} ${c.given} (saved: ${c.saved})`).join(", ");
}

/** The saved flags of a run: its groups, as a saved record holds them. */
export interface SavedFlags {
  shape?: FlagValues;
  steering?: FlagValues;
  /** The run's length (older files keep it in `shape`). */
  length?: FlagValues;
}

/** How the run's length flags (`--steps`) differ from the saved ones (see the module comment). */
export function lengthChanges(saved: SavedFlags, given: { length?: FlagValues }): FlagChange[] {
  return given.length ? flagChanges(saved.length ?? saved.shape, given.length) : [];
}

/**
 * Throws a UsageError when the flags that shape the run differ from those
 * saved in `path`, or when those that steer it differ without `override`;
 * returns the steering changes (to print and apply) otherwise.
 */
export function checkResumeFlags(
  path: string,
  saved: SavedFlags,
  given: { shape: FlagValues; steering: FlagValues; length?: FlagValues },
  override: boolean,
): FlagChange[] {
  const shape = flagChanges(saved.shape, given.shape);
  if (shape.length > 0) {
    const lengths = given.length ? Object.keys(given.length).map((f) => `--${f}`) : [];
    const free = lengths.length > 0
      ? ` (${lengths.join(", ")} may change: it sets the run's ` +
        "length)"
      : "";
    throw new UsageError(
      `${path} was saved by a run with other flags: ${describeChanges(shape)}. Resume with ` +
        `the saved flags${free}.`,
    );
  }
  const steering = flagChanges(saved.steering, given.steering);
  if (steering.length > 0 && !override) {
    throw new UsageError(
      `resuming ${path} would change ${describeChanges(steering)}; give the saved values, or ` +
        "add --override to train on with the new ones.",
    );
  }
  return steering;
}
