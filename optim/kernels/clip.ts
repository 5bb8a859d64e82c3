/**
 * Kernels of clip-by-global-norm, all f32 and all on the GPU: each gradient's
 * sum of squares lands in its own slots of a partials buffer (one per chunk of
 * {@link SUM_SQUARES_CHUNK} elements, each summed by one workgroup); one thread then
 * turns the partials into the global norm and the clip coefficient
 * min(1, maxNorm / (norm + 1e-6)); gradients are scaled by reading it. The
 * per-gradient kernels take several gradients per dispatch (`multi_tensor.ts`).
 */
import {
  defineKernel,
  type DeviceArray,
  type DType,
  multiTensorDispatches,
  REDUCE_THREADS,
  SLOT_UNIFORMS,
  slotBindings,
  slotBuffers,
  useSubgroups,
  WGSL_GRID_BUILTINS,
  WGSL_SUBGROUP_REDUCE,
  WGSL_WORKGROUP_REDUCE,
  wgslForEachSlot,
} from "../../gpu/kernels/mod.ts";

const WORKGROUP = 256;

/**
 * Elements one workgroup sums: 4096 per thread. NOTE: lavapipe stops a shader
 * invocation after 65535 loop iterations in all, silently, so one workgroup
 * per gradient summed only the first ~4.2M elements of a larger one there; a
 * chunk per workgroup also spreads a large gradient over the GPU.
 */
export const SUM_SQUARES_CHUNK = REDUCE_THREADS * 4096;

/**
 * partials[base + w] = Σ g² over the w-th chunk of the dispatch's gradients
 * (a workgroup per chunk, the gradients' chunks one after another).
 */
export const sumSquaresKernel = defineKernel({
  name: "clip_sum_squares",
  // subgroups: each workgroup's sum through subgroups (GPUs with the feature).
  bindings: (c: { dtype: DType; slots: number; subgroups: boolean }) => [
    ...slotBindings(c.slots, [{ name: "g", type: c.dtype }]),
    { name: "partials", type: "f32", write: true },
  ],
  uniforms: { ...SLOT_UNIFORMS, base: "u32" },
  source: ({ slots, subgroups }) =>
    `${subgroups ? WGSL_SUBGROUP_REDUCE : WGSL_WORKGROUP_REDUCE}
@compute @workgroup_size(${REDUCE_THREADS})
fn main(${WGSL_GRID_BUILTINS}) {
  ${
      wgslForEachSlot(slots, (k) =>
        `let start = wg * ${SUM_SQUARES_CHUNK}u;
      let stop = min(n, start + ${SUM_SQUARES_CHUNK}u);
      var acc = 0.0;
      for (var i = start + lid; i < stop; i += ${REDUCE_THREADS}u) { let v = ld_g${k}(i); acc += v * v; }
      let total = reduce_sum(acc, lid);
      if (lid == 0u) { partials[p.base + all_wg] = total; }`)
    }
}`,
});

/**
 * norm[0] = √Σ partials; coef[0] = min(1, maxNorm / (norm + 1e-6)). With
 * `scaled` the gradients summed are still to be multiplied by
 * grad_scale[0] (a loss scale's inverse, deferred to the fused update):
 * norm[0] = √Σ partials · grad_scale[0], the norm of the unscaled gradients.
 */
export const clipCoefficientKernel = defineKernel({
  name: "clip_coefficient",
  bindings: (c: { scaled?: boolean }) => [
    { name: "partials", type: "f32" },
    ...(c.scaled ? [{ name: "grad_scale", type: "f32" as const }] : []),
    { name: "norm", type: "f32", write: true },
    { name: "coef", type: "f32", write: true },
  ],
  uniforms: { count: "u32", max_norm: "f32" },
  source: ({ scaled }) =>
    `@compute @workgroup_size(1)
fn main() {
  var total = 0.0;
  for (var i = 0u; i < p.count; i++) { total += partials[i]; }
  let n = sqrt(total)${scaled ? " * grad_scale[0]" : ""};
  norm[0] = n;
  coef[0] = min(1.0, p.max_norm / (n + 1e-6));
}`,
});

/** g *= coef[0] in place, for each of the dispatch's gradients. */
export const scaleByCoefficientKernel = defineKernel({
  name: "clip_scale",
  bindings: (c: { dtype: DType; slots: number }) => [
    ...slotBindings(c.slots, [{ name: "g", type: c.dtype, write: true }]),
    { name: "coef", type: "f32" },
  ],
  uniforms: SLOT_UNIFORMS,
  source: ({ slots }) =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${
      wgslForEachSlot(slots, (k) =>
        `let i = wg * ${WORKGROUP}u + lid;
      if (i < n) { st_g${k}(i, ld_g${k}(i) * coef[0]); }`)
    }
}`,
});

/** How both per-gradient kernels share dispatches: a gradient and one shared buffer, by dtype. */
const ONE_GRADIENT_A_SLOT = {
  perTensor: 1,
  shared: 1,
  key: (g: DeviceArray) => g.dtype,
  size: (g: DeviceArray) => g.size,
};

/** Slots of the partials buffer a gradient of `size` elements fills (at least one). */
export function sumSquaresSlots(size: number): number {
  return Math.max(1, Math.ceil(size / SUM_SQUARES_CHUNK));
}

/**
 * Writes Σ g² of each gradient, chunk by chunk, into `partials`: gradient i
 * fills {@link sumSquaresSlots} slots starting where gradient i − 1's end
 * (the first at 0). Gradients of one dtype share dispatches.
 */
export function launchSumSquaresInto(grads: readonly DeviceArray[], partials: DeviceArray): void {
  const gpu = partials.gpu;
  let base = 0;
  const plan = { ...ONE_GRADIENT_A_SLOT, workgroups: (g: DeviceArray) => sumSquaresSlots(g.size) };
  for (const { chunk, table } of multiTensorDispatches(gpu, grads, plan)) {
    gpu.dispatch(
      gpu.kernel(sumSquaresKernel, {
        dtype: chunk[0].dtype,
        slots: chunk.length,
        subgroups: useSubgroups(gpu),
      }),
      { ...slotBuffers("g", chunk), partials },
      { ...table.uniforms, base },
      table.grid,
    );
    base += table.workgroups;
  }
}

/**
 * Fills `norm` and `coef` (f32 [1] each) from the first `count` partials,
 * of gradients still to be multiplied by `gradScale`[0] when given.
 */
export function launchClipCoefficientInto(
  partials: DeviceArray,
  count: number,
  maxNorm: number,
  norm: DeviceArray,
  coef: DeviceArray,
  gradScale?: DeviceArray,
): void {
  const kernel = norm.gpu.kernel(clipCoefficientKernel, gradScale ? { scaled: true } : {});
  const buffers = gradScale
    ? { partials, grad_scale: gradScale, norm, coef }
    : { partials, norm, coef };
  norm.gpu.dispatch(kernel, buffers, { count, max_norm: maxNorm }, [1]);
}

/** Multiplies each of `grads` in place by `coef[0]`. */
export function launchScaleByCoefficientInto(
  grads: readonly DeviceArray[],
  coef: DeviceArray,
): void {
  const gpu = coef.gpu;
  const work = grads.filter((g) => g.size > 0);
  const plan = {
    ...ONE_GRADIENT_A_SLOT,
    workgroups: (g: DeviceArray) => Math.ceil(g.size / WORKGROUP),
  };
  for (const { chunk, table } of multiTensorDispatches(gpu, work, plan)) {
    gpu.dispatch(
      gpu.kernel(scaleByCoefficientKernel, { dtype: chunk[0].dtype, slots: chunk.length }),
      { ...slotBuffers("g", chunk), coef },
      table.uniforms,
      table.grid,
    );
  }
}
