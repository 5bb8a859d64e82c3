/** Tolerance checks: |actual − expected| ≤ atol + rtol·|expected|, element by element. */
import { AssertionError } from "node:assert/strict";

/** Per-dtype tolerance. */
export interface Tolerance {
  atol: number;
  rtol: number;
}

/**
 * Default tolerances. f32: our kernels accumulate in f32 (unit roundoff
 * 6e-8), so a few hundred terms stay far inside 1e-5. f16: inputs are
 * rounded to f16 before the reference runs, but the output is stored in f16,
 * whose half-ulp is 2⁻¹¹ ≈ 4.9e-4 relative; 2e-3 leaves room for that plus
 * f32 accumulation. bf16: the same, with bf16's 8 significant bits.
 */
export const TOL: Record<"f32" | "f16" | "bf16", Tolerance> = {
  f32: { atol: 1e-5, rtol: 1e-4 },
  f16: { atol: 2e-3, rtol: 2e-3 },
  // bf16 keeps 8 significant bits: its half-ulp is 2⁻⁸ ≈ 3.9e-3 relative.
  bf16: { atol: 1.6e-2, rtol: 1.6e-2 },
};

/**
 * The tolerance of a K-long dot product in `dtype`: long sums lose more, so
 * the absolute error may grow like √K times the unit roundoff (a misplaced
 * element or a lost k-tile is off by far more).
 */
export function tolFor(dtype: keyof typeof TOL, k: number): Tolerance {
  const t = TOL[dtype];
  return { atol: t.atol * Math.max(1, Math.sqrt(k) / 4), rtol: t.rtol };
}

/** Fails with the worst element when any element is out of tolerance. */
export function assertClose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  tol: Tolerance,
  what = "values",
): void {
  if (actual.length !== expected.length) {
    throw new AssertionError({
      message: `${what}: length ${actual.length} != expected ${expected.length}`,
    });
  }
  let worst = -1, worstExcess = 0;
  for (let i = 0; i < actual.length; i++) {
    const err = Math.abs(actual[i] - expected[i]);
    const allowed = tol.atol + tol.rtol * Math.abs(expected[i]);
    if (!(err <= allowed) && (worst < 0 || err - allowed > worstExcess)) {
      worst = i;
      worstExcess = err - allowed;
    }
  }
  if (worst >= 0) {
    throw new AssertionError({
      message: `${what}: element ${worst} is ${actual[worst]}, expected ${expected[worst]} ` +
        `(atol ${tol.atol}, rtol ${tol.rtol}; ${actual.length} elements)`,
    });
  }
}

/**
 * {@link assertClose} for results that may be NaN or ±∞, at the scale of the
 * terms they are made of: NaN exactly where `expected` is NaN, the same
 * infinity where it is infinite, and elsewhere |actual − expected| ≤
 * atol·scale + rtol·|m_i|, with m the magnitudes of the terms each result
 * sums (default |expected|) and `scale` the largest finite one (or as
 * given): a rounding error is relative to the terms, not to a result that
 * cancels to 1e-9, and gradients of 1e-20 are compared at their own scale,
 * not at an absolute 1e-5.
 */
export function assertCloseScaled(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  tol: Tolerance,
  what = "values",
  options: { magnitudes?: ArrayLike<number>; scale?: number } = {},
): void {
  if (actual.length !== expected.length) {
    throw new AssertionError({
      message: `${what}: length ${actual.length} != expected ${expected.length}`,
    });
  }
  const magnitudes = options.magnitudes ?? Float64Array.from(expected, Math.abs);
  const special = (i: number) => !Number.isFinite(expected[i]) || !Number.isFinite(actual[i]);
  let scale = 0;
  for (let i = 0; i < expected.length; i++) {
    if (!special(i) && Number.isFinite(magnitudes[i])) scale = Math.max(scale, magnitudes[i]);
  }
  scale = options.scale ?? scale;
  let worst = -1, worstExcess = 0;
  for (let i = 0; i < actual.length; i++) {
    const excess = special(i)
      ? (Object.is(actual[i], expected[i]) || actual[i] === expected[i] ? 0 : Infinity)
      : Math.abs(actual[i] - expected[i]) - (tol.atol * scale + tol.rtol * Math.abs(magnitudes[i]));
    if (!(excess <= 0) && (worst < 0 || excess > worstExcess)) {
      worst = i;
      worstExcess = excess;
    }
  }
  if (worst >= 0) {
    throw new AssertionError({
      message: `${what}: element ${worst} is ${actual[worst]}, expected ${expected[worst]} ` +
        `(magnitude ${magnitudes[worst]}, scale ${scale}; atol ${tol.atol}, rtol ${tol.rtol} ` +
        `relative to them; ${actual.length} elements)`,
    });
  }
}
