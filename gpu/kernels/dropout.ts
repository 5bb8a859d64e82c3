/**
 * Dropout as a pure function of (key, counter): element i is kept when
 * random_uniform(key, counter + i) ≥ p, and kept values are scaled by
 * 1/(1 − p); a dropped NaN or ±inf gives NaN, as PyTorch's x · mask does.
 * Forward and backward run the same kernel, so the mask is never
 * stored; it is regenerated bit-exactly from the same random range.
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel } from "../device/kernel.ts";
import { type RandomRange, WGSL_RANDOM } from "./wgsl/random.ts";
import { DeviceArray } from "../device/device_array.ts";
import { moveGrid, wgslComputeMain } from "./wgsl/move_elements.ts";

/** The dropout kernel family (one per dtype). */
export const dropoutKernel = defineKernel({
  name: "dropout",
  bindings: (c: { dtype: DType }) => [
    { name: "src", type: c.dtype },
    { name: "dst", type: c.dtype, write: true },
  ],
  uniforms: { n: "u32", key: "u32", counter: "u32", p: "f32", scale: "f32" },
  source: ({ dtype }) =>
    `${WGSL_RANDOM}
fn value(i: u32) -> f32 {
  let keep = random_uniform(p.key, p.counter + i) >= p.p;
  let x = ld_src(i);
  // PyTorch multiplies by the mask, so a dropped NaN or ±inf is x·0 = NaN, not 0: set the
  // quiet bit of its all-ones exponent (from bits: WGSL may assume no NaN or inf).
  let non_finite = (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u;
  let dropped = select(0.0, bitcast<f32>(bitcast<u32>(x) | 0x00400000u), non_finite);
  return select(dropped, x * p.scale, keep);
}
${wgslComputeMain(dtype, "dst", "p.n")}`,
});

/** src masked and scaled by the dropout mask of `range` with drop probability `p` (no autograd). */
export function launchDropout(src: DeviceArray, p: number, range: RandomRange): DeviceArray {
  const dst = DeviceArray.empty(src.shape, src.dtype, src.gpu);
  const n = src.size;
  if (n === 0) return dst;
  const kernel = src.gpu.kernel(dropoutKernel, { dtype: src.dtype });
  src.gpu.dispatch(
    kernel,
    { src, dst },
    { n, key: range.key, counter: range.counter, p, scale: 1 / (1 - p) },
    moveGrid(src.dtype, n),
    {},
    // A captured step draws a new range at each replay (the range object is refilled).
    () => ({ key: range.key, counter: range.counter }),
  );
  return dst;
}
