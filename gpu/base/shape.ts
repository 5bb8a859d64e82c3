import { ShapeError } from "./errors.ts";
import { shortValue } from "./short_text.ts";

/** A tensor's extents, outermost first (row-major). */
export type Shape = readonly number[];

/** Number of elements in a tensor of this shape (1 for a scalar `[]`). */
export function sizeOf(shape: Shape): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** `[2, 3]` as it appears in error messages. */
export function shapeString(shape: Shape): string {
  return `[${shape.join(", ")}]`;
}

/** Throws unless every extent is a non-negative integer. */
export function assertValidShape(op: string, shape: Shape): void {
  if (!Array.isArray(shape)) {
    throw new ShapeError(
      `${op}: the shape must be an array of extents such as [2, 3], got ${shortValue(shape)}.`,
    );
  }
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 0) {
      throw new ShapeError(
        `${op}: shape ${
          shapeString(shape)
        } is invalid; every extent must be a non-negative integer.`,
      );
    }
  }
}

/** True when both shapes have the same rank and extents. */
export function sameShape(a: Shape, b: Shape): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/** Normalises a possibly negative axis; throws a clear error when out of range. */
export function normalizeAxis(op: string, axis: number, rank: number): number {
  const a = axis < 0 ? axis + rank : axis;
  if (!Number.isInteger(a) || a < 0 || a >= Math.max(rank, 1)) {
    throw new ShapeError(`${op}: axis ${axis} is out of range for a tensor of rank ${rank}.`);
  }
  return a;
}
