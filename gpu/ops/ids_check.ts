/** The up-front check of integer ids (embedding rows, class targets) against a count. */
import { ValueError } from "../base/errors.ts";
import type { Tensor } from "../tensor/tensor.ts";
import { runtime } from "../tensor/runtime_state.ts";

/**
 * Throws unless every id in `ids` lies in [0, count) or equals `except`
 * (cross-entropy's ignore index), judged from the host-known range so no
 * GPU read is needed. A captured step checks each new batch's ids again.
 */
export function assertIdsInRange(op: string, ids: Tensor, count: number, except?: number): void {
  runtime.stepRecorder?.noteCheck(() => (assertIdsInRange(op, ids, count, except), null));
  const range = ids.indexRange;
  if (!range) {
    throw new ValueError(
      `${op}: ids ${ids.describe()} have no known range; create them with Tensor.from(..., { dtype: "i32" }).`,
    );
  }
  if (ids.size === 0) return;
  // The smallest and largest id other than `except`; only an extreme can be `except`
  // when it lies outside [0, count), and an `except` inside needs no special case.
  const min = range.min === except ? range.aboveMin : range.min;
  const max = range.max === except ? range.belowMax : range.max;
  if (min === Infinity) return; // every id is `except`
  if (min < 0 || max >= count) {
    const allowed = except === undefined ? "" : ` (or be the ignore index ${except})`;
    throw new ValueError(
      `${op}: ids ${ids.describe()} range over [${min}, ${max}] but must lie in ` +
        `[0, ${count - 1}]${allowed} (${count} classes or rows).`,
    );
  }
}
