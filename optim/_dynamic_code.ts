/**
 * bitsandbytes' dynamic (non-linear) 8-bit code maps: the 256 values an
 * 8-bit optimizer state byte stands for, times its block's absmax. Built
 * as `bitsandbytes.functional.create_dynamic_map(signed, 7, 8)` builds
 * them: for each decade 10⁻⁶ … 10⁰ the midpoints of a linspace(0.1, 1)
 * grid, twice as fine per decade, so small values keep their relative
 * precision (a float with a 7-step exponent and a growing fraction); plus
 * 0 and 1, sorted ascending.
 * @internal
 */

/** Decades of the map (bitsandbytes' `max_exponent_bits`). */
const DECADES = 7;

/**
 * The signed map (Adam's first moment: 127 negative values, 0 at index
 * {@link SIGNED_ZERO_CODE}, 128 positive values ending at 1) or the unsigned
 * one (the second moment: 0 at index 0, 255 positive values ending at 1).
 * Computed in f64 and rounded once to f32; bitsandbytes' torch f32
 * arithmetic lands within 2.5e-7 (relative) of each value.
 */
export function dynamicCode(signed: boolean): Float32Array {
  const values: number[] = [0, 1];
  for (let i = 0; i < DECADES; i++) {
    // A signed map spends a bit on the sign, so each decade has half as many values.
    const count = 2 ** (signed ? i : i + 1);
    const scale = 10 ** (i - (DECADES - 1));
    for (let j = 0; j < count; j++) {
      // The midpoints of linspace(0.1, 1, count + 1).
      const mean = 0.1 + 0.9 * (j + 0.5) / count;
      values.push(scale * mean);
      if (signed) values.push(-scale * mean);
    }
  }
  return Float32Array.from(values.sort((a, b) => a - b));
}

/** Index of the signed map's 0 (byte 0 stands for −0.993). */
export const SIGNED_ZERO_CODE = 127;
