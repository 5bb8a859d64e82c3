/**
 * Float data on the CPU (a file's bytes) as numbers and back, for f32, f16
 * and bf16: reading is exact (every value of the three is an f32), writing
 * rounds to nearest-even, as a GPU cast does.
 */
import { bf16FromF32, f32FromBf16, type FloatDType } from "../gpu/mod.ts";

/**
 * The exact values of little-endian float bytes of `dtype`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { floatsOfBytes } from "./host_floats.ts";
 * const bf16 = new Uint8Array(new Uint16Array([0x3f80, 0xc040]).buffer);
 * assert.equal(floatsOfBytes(bf16, "bf16").join(), "1,-3");
 * ```
 */
export function floatsOfBytes(bytes: Uint8Array, dtype: FloatDType): Float32Array | Float16Array {
  const aligned = bytes.byteOffset % 4 === 0 ? bytes : bytes.slice();
  const { buffer, byteOffset, byteLength } = aligned;
  if (dtype === "f32") return new Float32Array(buffer, byteOffset, byteLength / 4);
  if (dtype === "f16") return new Float16Array(buffer, byteOffset, byteLength / 2);
  return f32FromBf16(new Uint16Array(buffer, byteOffset, byteLength / 2));
}

/**
 * Little-endian bytes of `values` in `dtype`, each rounded to nearest-even
 * (bf16: NaN becomes 0x7FC0, as on the GPU).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { bytesOfFloats } from "./host_floats.ts";
 * assert.equal(bytesOfFloats([1, 2], "bf16").byteLength, 4);
 * ```
 */
export function bytesOfFloats(values: ArrayLike<number>, dtype: FloatDType): Uint8Array {
  const out = dtype === "f32"
    ? Float32Array.from(values)
    : dtype === "f16"
    ? Float16Array.from(values)
    : bf16FromF32(values);
  return new Uint8Array(out.buffer);
}
