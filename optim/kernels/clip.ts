/**
 * Kernels of clip-by-global-norm, all f32 and all on the GPU: each gradient's
 * sum of squares lands in its own slots of a partials buffer (one per chunk of
 * {@link SUM_SQUARES_CHUNK} elements, each summed by one workgroup); one thread then
 * turns the partials into the global norm and the clip coefficient
 * min(1, maxNorm / (norm + 1e-6)); gradients are scaled by reading it.
 */
import type { DType } from "../../gpu/dtype.ts";
import { defineKernel } from "../../gpu/kernel.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "../../gpu/kernels/grid.ts";
import { REDUCE_THREADS, WGSL_WORKGROUP_REDUCE } from "../../gpu/kernels/wgsl_math.ts";
import type { Tensor } from "../../gpu/tensor.ts";

const WORKGROUP = 256;

/**
 * Elements one workgroup sums: 4096 per thread. NOTE: lavapipe stops a shader
 * invocation after 65535 loop iterations in all, silently, so one workgroup
 * per gradient summed only the first ~4.2M elements of a larger one there; a
 * chunk per workgroup also spreads a large gradient over the GPU.
 */
export const SUM_SQUARES_CHUNK = REDUCE_THREADS * 4096;

/** partials[slot + chunk] = Σ g² over chunk `chunk` (a workgroup per chunk). */
export const sumSquaresKernel = defineKernel({
  name: "clip_sum_squares",
  bindings: (c: { dtype: DType }) => [
    { name: "g", type: c.dtype },
    { name: "partials", type: "f32", write: true },
  ],
  uniforms: { n: "u32", slot: "u32" },
  source: () =>
    `${WGSL_WORKGROUP_REDUCE}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  let chunk = ${WGSL_WORKGROUP_INDEX};
  let start = chunk * ${SUM_SQUARES_CHUNK}u;
  let stop = min(p.n, start + ${SUM_SQUARES_CHUNK}u);
  var acc = 0.0;
  for (var i = start + lid; i < stop; i += ${REDUCE_THREADS}u) { let v = f32(g[i]); acc += v * v; }
  let total = reduce_sum(acc, lid);
  if (lid == 0u) { partials[p.slot + chunk] = total; }
}`,
});

/** norm[0] = √Σ partials; coef[0] = min(1, maxNorm / (norm + 1e-6)). */
export const clipCoefficientKernel = defineKernel({
  name: "clip_coefficient",
  bindings: (_: Record<string, never>) => [
    { name: "partials", type: "f32" },
    { name: "norm", type: "f32", write: true },
    { name: "coef", type: "f32", write: true },
  ],
  uniforms: { count: "u32", max_norm: "f32" },
  source: () =>
    `@compute @workgroup_size(1)
fn main() {
  var total = 0.0;
  for (var i = 0u; i < p.count; i++) { total += partials[i]; }
  norm[0] = sqrt(total);
  coef[0] = min(1.0, p.max_norm / (sqrt(total) + 1e-6));
}`,
});

/** g *= coef[0] in place. */
export const scaleByCoefficientKernel = defineKernel({
  name: "clip_scale",
  bindings: (c: { dtype: DType }) => [
    { name: "g", type: c.dtype, write: true },
    { name: "coef", type: "f32" },
  ],
  uniforms: { n: "u32" },
  source: ({ dtype }) =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  if (i >= p.n) { return; }
  g[i] = ${dtype}(f32(g[i]) * coef[0]);
}`,
});

/** Slots of the partials buffer a gradient of `size` elements fills (at least one). */
export function sumSquaresSlots(size: number): number {
  return Math.max(1, Math.ceil(size / SUM_SQUARES_CHUNK));
}

/** Writes Σ g² of `grad`, chunk by chunk, into `partials[slot ..]` ({@link sumSquaresSlots} of them). */
export function launchSumSquares(grad: Tensor, partials: Tensor, slot: number): void {
  const kernel = grad.gpu.kernel(sumSquaresKernel, { dtype: grad.dtype });
  const grid = grid1d(sumSquaresSlots(grad.size));
  grad.gpu.dispatch(kernel, { g: grad, partials }, { n: grad.size, slot }, grid);
}

/** Fills `norm` and `coef` (f32 [1] each) from the first `count` partials. */
export function launchClipCoefficient(
  partials: Tensor,
  count: number,
  maxNorm: number,
  norm: Tensor,
  coef: Tensor,
): void {
  const kernel = norm.gpu.kernel(clipCoefficientKernel, {});
  norm.gpu.dispatch(kernel, { partials, norm, coef }, { count, max_norm: maxNorm }, [1]);
}

/** Multiplies `grad` in place by `coef[0]`. */
export function launchScaleByCoefficient(grad: Tensor, coef: Tensor): void {
  if (grad.size === 0) return;
  const kernel = grad.gpu.kernel(scaleByCoefficientKernel, { dtype: grad.dtype });
  grad.gpu.dispatch(
    kernel,
    { g: grad, coef },
    { n: grad.size },
    grid1d(Math.ceil(grad.size / WORKGROUP)),
  );
}
