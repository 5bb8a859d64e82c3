/**
 * Element types a {@link Tensor} can hold on the GPU: the float types that
 * compute and train, and `i32` for indices (class ids, token ids).
 */
export type DType = "f32" | "f16" | "i32";

/** The dtypes that carry gradients. */
export type FloatDType = "f32" | "f16";

/** Every float dtype, in a fixed order (handy for parameterised tests and errors). */
export const DTYPES: readonly FloatDType[] = ["f32", "f16"];

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
