/**
 * bf16 on the host: a bf16 value is the upper 16 bits of an f32, so
 * conversion is bit arithmetic. Rounding follows PyTorch's
 * `tensor.to(torch.bfloat16)` exactly: round to nearest, ties to even, on the
 * f32 bits (so the largest finite values round up to ±Inf, ±0 and subnormals
 * keep their bits), and every NaN becomes a quiet NaN: 0x7FC0, what c10's
 * scalar `round_to_nearest_even` returns (PyTorch's vectorised CPU path
 * writes 0xFFFF instead; both are NaN, which is all a NaN promises).
 */

/** The bf16 bits every NaN converts to (c10's scalar `round_to_nearest_even`). */
export const BF16_NAN = 0x7fc0;

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/**
 * The bf16 bits nearest to each value (first rounded to f32, as PyTorch
 * converts a double through float).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { bf16FromF32 } from "./bf16.ts";
 * assert.equal(bf16FromF32([1, -2])[0], 0x3f80);
 * assert.equal(bf16FromF32([NaN])[0], 0x7fc0);
 * ```
 */
export function bf16FromF32(values: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) {
    F32[0] = values[i];
    const bits = U32[0];
    out[i] = (bits & 0x7fffffff) > 0x7f800000
      ? BF16_NAN
      : (bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16;
  }
  return out;
}

/**
 * The exact f32 values of bf16 bits (a shift: every bf16 value is an f32).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { f32FromBf16 } from "./bf16.ts";
 * assert.equal(f32FromBf16(new Uint16Array([0x3f80, 0xc000]))[1], -2);
 * ```
 */
export function f32FromBf16(bits: Uint16Array): Float32Array {
  const words = new Uint32Array(bits.length);
  for (let i = 0; i < bits.length; i++) words[i] = bits[i] << 16;
  return new Float32Array(words.buffer);
}
