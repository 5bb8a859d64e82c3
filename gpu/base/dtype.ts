/**
 * Element types a {@link Tensor} can hold on the GPU: the float types that
 * compute and train, and `i32` for indices (class ids, token ids).
 *
 * WGSL has no bf16 type: a bf16 tensor is stored two values to a 32-bit word
 * (element 2i in the low half of word i, as a little-endian `Uint16Array` of
 * bf16 bits would lie), widened to f32 when a kernel reads it and rounded to
 * nearest-even when it writes it (see `gpu/device/kernel.ts`'s accessors).
 */
import { DTypeError, fail } from "./errors.ts";

/** An element type. */
export type DType = "f32" | "f16" | "bf16" | "i32";

/** The dtypes that carry gradients. */
export type FloatDType = "f32" | "f16" | "bf16";

/** Every float dtype, in a fixed order (handy for parameterised tests and errors). */
export const DTYPES: readonly FloatDType[] = ["f32", "f16", "bf16"];

/** Every dtype a tensor can hold. */
export const TENSOR_DTYPES: readonly DType[] = ["f32", "f16", "bf16", "i32"];

/**
 * Throws a clear error unless `dtype` is one of {@link TENSOR_DTYPES}: a bad
 * string from plain JavaScript must never reach a shader.
 */
export function assertDType(where: string, dtype: unknown): asserts dtype is DType {
  if (!TENSOR_DTYPES.includes(dtype as DType)) {
    fail(
      DTypeError,
      where,
      `dtype ${JSON.stringify(dtype)} is not supported; use one of ${TENSOR_DTYPES.join(", ")}.`,
    );
  }
}

/** Bytes one element of `dtype` occupies in a GPU buffer. */
export function bytesPerElement(dtype: DType): number {
  return dtype === "f16" || dtype === "bf16" ? 2 : 4;
}

/**
 * Whether `dtype` is one of the 16-bit float types (f16, bf16): half the bytes of f32.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { isHalf } from "./dtype.ts";
 * assert.ok(isHalf("bf16"));
 * assert.ok(!isHalf("f32"));
 * ```
 */
export function isHalf(dtype: DType): dtype is "f16" | "bf16" {
  return dtype === "f16" || dtype === "bf16";
}

/**
 * The WGSL scalar type a kernel computes `dtype` in: itself for f32, f16 and
 * i32; f32 for bf16 (which WGSL lacks: kernels read and write it through the
 * `ld_`/`st_` accessors, see `gpu/device/kernel.ts`).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { wgslType } from "./dtype.ts";
 * assert.equal(wgslType("bf16"), "f32");
 * assert.equal(wgslType("f16"), "f16");
 * ```
 */
export function wgslType(dtype: DType): string {
  return dtype === "bf16" ? "f32" : dtype;
}

/** `enable f16;` when any of `dtypes` is f16, else nothing: only f16 kernels may enable it. */
export function wgslEnables(...dtypes: DType[]): string {
  return dtypes.includes("f16") ? "enable f16;\n" : "";
}
