/**
 * Axis permutation as a contiguous copy, for tensors of rank ≤ 4. The kernel
 * sees every tensor as 4-D (leading extents of 1) and gathers: output element
 * (c0, c1, c2, c3) reads input element Σ c_k · stride_k, where stride_k is
 * the input stride of the axis that output axis k takes. Shapes and strides
 * are uniforms, so one pipeline per dtype serves every permutation.
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel } from "../device/kernel.ts";
import type { Shape } from "../base/shape.ts";
import { DeviceArray } from "../device/device_array.ts";
import { movedType, moveGrid, wgslMoveMain } from "./wgsl/move_elements.ts";

/** The most axes a permutation handles. */
export const PERMUTE_MAX_RANK = 4;

/** y[c0, c1, c2, c3] = x[c0·s0 + c1·s1 + c2·s2 + c3·s3]. */
export const permuteKernel = defineKernel({
  name: "permute",
  bindings: (c: { dtype: DType }) => [
    { name: "x", type: movedType(c.dtype) },
    { name: "y", type: movedType(c.dtype), write: true },
  ],
  uniforms: {
    n: "u32",
    d1: "u32",
    d2: "u32",
    d3: "u32",
    s0: "u32",
    s1: "u32",
    s2: "u32",
    s3: "u32",
  },
  source: ({ dtype }) =>
    `fn source_index(i: u32) -> u32 {
  let c3 = i % p.d3;
  var t = i / p.d3;
  let c2 = t % p.d2;
  t = t / p.d2;
  let c1 = t % p.d1;
  let c0 = t / p.d1;
  return c0 * p.s0 + c1 * p.s1 + c2 * p.s2 + c3 * p.s3;
}
${wgslMoveMain(dtype, "x", "y", "p.n")}`,
});

/** Row-major strides of `shape`. */
function stridesOf(shape: Shape): number[] {
  const strides = new Array<number>(shape.length);
  let s = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    strides[d] = s;
    s *= shape[d];
  }
  return strides;
}

/**
 * A contiguous copy of `x` with its axes in `order` (output axis k is input
 * axis order[k]); `order` must already be a valid permutation of rank ≤ 4.
 * No autograd.
 */
export function launchPermute(x: DeviceArray, order: readonly number[]): DeviceArray {
  const outShape = order.map((a) => x.shape[a]);
  const y = DeviceArray.empty(outShape, x.dtype, x.gpu);
  if (y.size === 0) return y;
  const inStrides = stridesOf(x.shape);
  const pad = PERMUTE_MAX_RANK - order.length;
  const dims = [...new Array(pad).fill(1), ...outShape];
  const strides = [...new Array(pad).fill(0), ...order.map((a) => inStrides[a])];
  const kernel = x.gpu.kernel(permuteKernel, { dtype: x.dtype });
  const [s0, s1, s2, s3] = strides;
  x.gpu.dispatch(
    kernel,
    { x, y },
    { n: y.size, d1: dims[1], d2: dims[2], d3: dims[3], s0, s1, s2, s3 },
    moveGrid(x.dtype, y.size),
  );
  return y;
}
