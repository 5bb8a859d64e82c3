/**
 * Broadcasting of a second operand into the shape of the first, limited to
 * what the kernels address directly: the operand is repeated along one
 * contiguous block of axes (a bias over rows, a per-row value, a scalar...).
 */
import type { Broadcast } from "../kernels/elementwise.ts";
import { ShapeError } from "../base/errors.ts";
import { type Shape, shapeString, sizeOf } from "../base/shape.ts";

/** How `operand` repeats to fill `target`, or a clear error when it cannot. */
export function broadcastInto(op: string, target: Shape, operand: Shape): Broadcast {
  const fail = (why: string) =>
    new ShapeError(
      `${op}: cannot broadcast shape ${shapeString(operand)} to ${shapeString(target)}: ${why}.`,
    );
  if (operand.length > target.length) throw fail("the operand has more dimensions");
  const padded = [...Array(target.length - operand.length).fill(1), ...operand];
  let first = -1, last = -1;
  for (let d = 0; d < target.length; d++) {
    if (padded[d] === target[d]) continue;
    if (padded[d] !== 1) throw fail(`axis ${d} has ${padded[d]} where ${target[d]} is needed`);
    if (first < 0) first = d;
    last = d;
  }
  if (first < 0) return { mid: 1, inner: 1 };
  for (let d = first; d <= last; d++) {
    if (padded[d] !== 1 && target[d] !== 1) {
      throw fail("the repeated axes must be adjacent; reshape or expand the operand first");
    }
  }
  return { mid: sizeOf(target.slice(first, last + 1)), inner: sizeOf(target.slice(last + 1)) };
}

/** The [outer, axis, inner] view that sums a broadcast operand's gradient back. */
export function reductionOf(
  target: Shape,
  b: Broadcast,
): { outer: number; axis: number; inner: number } {
  const total = sizeOf(target);
  return { outer: total === 0 ? 0 : total / (b.mid * b.inner), axis: b.mid, inner: b.inner };
}

/** True when the broadcast is the identity (same number of elements). */
export function isSame(b: Broadcast): boolean {
  return b.mid === 1;
}
