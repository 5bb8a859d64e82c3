/**
 * Filling an array with one value on the GPU: what a tensor of ones or
 * zeros made inside a step needs, without uploading it. An upload is a
 * `writeBuffer` in stream order, so the batch must submit everything
 * recorded before it first: a backward pass seeded from the host would
 * split its step in two submits.
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel } from "../device/kernel.ts";
import { DeviceArray } from "../device/device_array.ts";
import type { Gpu } from "../device/gpu.ts";
import { moveGrid, wgslComputeMain } from "./wgsl/move_elements.ts";

/** The fill kernel family (one per dtype). */
export const fillKernel = defineKernel({
  name: "fill",
  bindings: (c: { dtype: DType }) => [{ name: "dst", type: c.dtype, write: true }],
  uniforms: { n: "u32", value: "f32" },
  source: ({ dtype }) =>
    `fn value(i: u32) -> f32 { return p.value; }
${wgslComputeMain(dtype, "dst", "p.n")}`,
});

/** A new array of `shape` and `dtype` (a float dtype) on `gpu` with every element `value`. */
export function launchFill(
  shape: readonly number[],
  value: number,
  dtype: DType,
  gpu: Gpu,
): DeviceArray {
  const dst = DeviceArray.empty(shape, dtype, gpu);
  const n = dst.size;
  if (n > 0) {
    gpu.dispatch(gpu.kernel(fillKernel, { dtype }), { dst }, { n, value }, moveGrid(dtype, n));
  }
  return dst;
}
