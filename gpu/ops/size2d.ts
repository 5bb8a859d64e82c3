/** Sizes along the two spatial axes of NCHW ops (kernels, strides, padding, dilation). */

/** A size along both spatial axes: one number for both, or [height, width]. */
export type Size2d = number | readonly [number, number];

/**
 * `value` as a [height, width] pair of integers ≥ `min`; when it is not one,
 * a problem naming `name` is added to `problems` (reported all at once by
 * the caller) and [min, min] is returned.
 */
export function pairOf(
  name: string,
  value: unknown,
  min: number,
  problems: string[],
): [number, number] {
  const ok = (v: unknown): v is number => Number.isInteger(v) && (v as number) >= min;
  if (typeof value === "number" && ok(value)) return [value, value];
  if (Array.isArray(value) && value.length === 2 && ok(value[0]) && ok(value[1])) {
    return [value[0], value[1]];
  }
  const what = min > 0
    ? (min === 1 ? "a positive integer" : `an integer ≥ ${min}`)
    : "an integer ≥ 0";
  problems.push(
    `${name} must be ${what} or a pair [height, width] of them, got ${JSON.stringify(value)}`,
  );
  return [min, min];
}
