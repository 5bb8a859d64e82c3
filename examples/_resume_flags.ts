/**
 * What a resumed run may and may not change. A saved training state records
 * the flags it was trained with in two groups: those that shape the run (the
 * model, the data order, the optimizer's kind and state layout, the
 * schedule's length), which a resumed run must repeat, and those that only
 * steer it (learning rate, loss scale), which `--override` may change — and
 * then each change is printed, so that no flag changes training silently.
 *
 * @module
 */
import { UsageError } from "./_cli.ts";

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

/** `--lr 0.002 → 0.01, --seed 0 → 1`. */
export function describeChanges(changes: FlagChange[]): string {
  return changes.map((c) => `--${c.flag} ${c.saved} → ${c.given}`).join(", ");
}

/**
 * Throws a UsageError when the flags that shape the run differ from those
 * saved in `path`, or when those that steer it differ without `override`;
 * returns the steering changes (to print and apply) otherwise.
 */
export function checkResumeFlags(
  path: string,
  saved: { shape?: FlagValues; steering?: FlagValues },
  given: { shape: FlagValues; steering: FlagValues },
  override: boolean,
): FlagChange[] {
  const shape = flagChanges(saved.shape, given.shape);
  if (shape.length > 0) {
    throw new UsageError(
      `${path} was saved by another run (${describeChanges(shape)}, saved → given); ` +
        "Resume with the same flags.",
    );
  }
  const steering = flagChanges(saved.steering, given.steering);
  if (steering.length > 0 && !override) {
    throw new UsageError(
      `resuming ${path} would change ${describeChanges(steering)} (saved → given); ` +
        "give the saved values, or add --override to train on with the new ones.",
    );
  }
  return steering;
}
