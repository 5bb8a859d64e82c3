/**
 * Element types a {@link Tensor} can hold on the GPU: the float types that
 * compute and train, and `i32` for indices (class ids, token ids).
 */
import { DTypeError, fail } from "./errors.ts";

/** An element type. */
export type DType = "f32" | "f16" | "i32";

/** The dtypes that carry gradients. */
export type FloatDType = "f32" | "f16";

/** Every float dtype, in a fixed order (handy for parameterised tests and errors). */
export const DTYPES: readonly FloatDType[] = ["f32", "f16"];

/** Every dtype a tensor can hold. */
export const TENSOR_DTYPES: readonly DType[] = ["f32", "f16", "i32"];

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
  return dtype === "f16" ? 2 : 4;
}

/** The WGSL scalar type that stores `dtype`. */
export function wgslType(dtype: DType): string {
  return dtype;
}

/** `enable f16;` when any of `dtypes` is f16, else nothing: only f16 kernels may enable it. */
export function wgslEnables(...dtypes: DType[]): string {
  return dtypes.includes("f16") ? "enable f16;\n" : "";
}
