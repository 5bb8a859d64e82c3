/**
 * Reductions along one axis. The input is viewed as [outer, axis, inner] and
 * the output as [outer, inner]; one workgroup per output element strides over
 * the axis and combines in workgroup memory. Accumulation is f32 always.
 */
import type { DType } from "../dtype.ts";
import { defineKernel } from "../kernel.ts";
import type { Shape } from "../shape.ts";
import { Tensor } from "../tensor.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./grid.ts";
import { REDUCE_THREADS, WGSL_LOWEST, WGSL_WORKGROUP_REDUCE } from "./wgsl_math.ts";

/** What a reduction computes. `sum` is multiplied by a scale (1/n gives a mean). */
export type ReduceOp = "sum" | "max";

/** The [outer, axis, inner] view of a reduction. */
export interface ReduceView {
  outer: number;
  axis: number;
  inner: number;
}

export const reduceKernel = defineKernel({
  name: "reduce",
  bindings: (c: { op: ReduceOp; dtype: DType; out: DType }) => [
    { name: "src", type: c.dtype },
    { name: "dst", type: c.out, write: true },
  ],
  uniforms: { outer: "u32", axis: "u32", inner: "u32", scale: "f32" },
  source: ({ op, out }) =>
    `${WGSL_WORKGROUP_REDUCE}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  let o = ${WGSL_WORKGROUP_INDEX};
  if (o >= p.outer * p.inner) { return; }
  let base = (o / p.inner) * p.axis * p.inner + o % p.inner;
  var acc = ${op === "sum" ? "0.0" : WGSL_LOWEST};
  for (var a = lid; a < p.axis; a += ${REDUCE_THREADS}u) {
    let v = f32(src[base + a * p.inner]);
    acc = ${op === "sum" ? "acc + v" : "max(acc, v)"};
  }
  let total = reduce_${op}(acc, lid);
  if (lid == 0u) { dst[o] = ${out}(total${op === "sum" ? " * p.scale" : ""}); }
}`,
});

/**
 * Reduces `src` (viewed as `view`) along the middle axis into a new tensor of
 * `shape` (outer·inner elements). `scale` multiplies sums. No autograd.
 */
export function launchReduce(
  op: ReduceOp,
  src: Tensor,
  view: ReduceView,
  shape: Shape,
  options: { scale?: number; out?: DType } = {},
): Tensor {
  const dst = Tensor.empty(shape, options.out ?? src.dtype, src.gpu);
  const outputs = view.outer * view.inner;
  if (outputs === 0) return dst;
  const kernel = src.gpu.kernel(reduceKernel, { op, dtype: src.dtype, out: dst.dtype });
  src.gpu.dispatch(
    kernel,
    { src, dst },
    { outer: view.outer, axis: view.axis, inner: view.inner, scale: options.scale ?? 1 },
    grid1d(outputs),
  );
  return dst;
}
