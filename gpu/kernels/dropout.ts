/**
 * Dropout as a pure function of (key, counter): element i is kept when
 * random_uniform(key, counter + i) ≥ p, and kept values are scaled by
 * 1/(1 − p). Forward and backward run the same kernel, so the mask is never
 * stored; it is regenerated bit-exactly from the same random range.
 */
import { type DType, wgslEnables } from "../dtype.ts";
import { defineKernel, f32Bits } from "../kernel.ts";
import { type RandomRange, WGSL_RANDOM } from "../random.ts";
import { Tensor } from "../tensor.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./grid.ts";

const WORKGROUP = 256;

/** The dropout kernel family (one per dtype). */
export const dropoutKernel = defineKernel<{ dtype: DType }>({
  name: "dropout",
  wgsl: ({ dtype }) =>
    `${wgslEnables(dtype)}${WGSL_RANDOM}
struct Params { n: u32, key: u32, counter: u32, p: u32, scale: u32 }
@group(0) @binding(0) var<storage, read> src: array<${dtype}>;
@group(0) @binding(1) var<storage, read_write> dst: array<${dtype}>;
@group(0) @binding(2) var<uniform> p: Params;
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  if (i >= p.n) { return; }
  let keep = random_uniform(p.key, p.counter + i) >= bitcast<f32>(p.p);
  dst[i] = ${dtype}(select(0.0, f32(src[i]) * bitcast<f32>(p.scale), keep));
}`,
});

/** src masked and scaled by the dropout mask of `range` with drop probability `p` (no autograd). */
export function launchDropout(src: Tensor, p: number, range: RandomRange): Tensor {
  const dst = Tensor.empty(src.shape, src.dtype, src.gpu);
  const n = src.size;
  if (n === 0) return dst;
  const kernel = src.gpu.kernel(dropoutKernel, { dtype: src.dtype });
  src.gpu.dispatch(
    kernel,
    [src.buffer, dst.buffer],
    [n, range.key, range.counter, f32Bits(p), f32Bits(1 / (1 - p))],
    grid1d(Math.ceil(n / WORKGROUP)),
  );
  return dst;
}
