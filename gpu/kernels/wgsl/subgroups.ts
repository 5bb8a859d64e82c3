/**
 * Subgroup reductions in kernels. Which kernels use them reads the adapter
 * profile ({@link useSubgroups}): a GPU whose device has the `subgroups`
 * feature. CPU adapters keep the workgroup-memory kernels, which are faster
 * there (lavapipe grants the feature, with small subgroups). `enable subgroups;`
 * is added by the pipeline cache where the device wants it
 * (`withSubgroupsDirective` in gpu/device/kernel.ts).
 */
import type { Gpu } from "../../device/gpu.ts";
import { REDUCE_THREADS, WGSL_MAX_OR_NAN } from "./math.ts";

/** Whether kernels on `gpu` reduce through subgroups: GPUs whose profile grants them. */
export function useSubgroups(gpu: Gpu): boolean {
  const p = gpu.adapterProfile;
  return !p.cpu && p.subgroups;
}

/**
 * `reduce_sum(v, lid)` and `reduce_max(v, lid)` over a workgroup of
 * {@link REDUCE_THREADS} threads through subgroups, as `WGSL_WORKGROUP_REDUCE`
 * gives them through workgroup memory (same names, every thread gets the
 * result, call in uniform control flow): each subgroup reduces its values,
 * its first thread stores the result, and every thread adds the (at most 64 /
 * subgroup size) stored results in order, after 2 barriers instead of 7.
 * The max runs a butterfly of shuffles through `max_or_nan`, so NaN wins.
 * NOTE: assumes a 1-D workgroup's subgroups are runs of consecutive `lid`
 * (true of the Vulkan drivers of NVIDIA, AMD, Intel and lavapipe); the
 * subgroup size is the number of threads of one (all are active here).
 */
export const WGSL_SUBGROUP_REDUCE =
  `${WGSL_MAX_OR_NAN}var<workgroup> partial: array<f32, ${REDUCE_THREADS}>;
fn reduce_subgroups(t: f32, lid: u32, is_max: bool) -> f32 {
  let n = subgroupAdd(1u);
  if (lid % n == 0u) { partial[lid / n] = t; }
  workgroupBarrier();
  var r = partial[0];
  for (var i = 1u; i < ${REDUCE_THREADS}u / n; i++) {
    r = select(r + partial[i], max_or_nan(r, partial[i]), is_max);
  }
  workgroupBarrier();
  return r;
}
fn reduce_sum(v: f32, lid: u32) -> f32 { return reduce_subgroups(subgroupAdd(v), lid, false); }
fn reduce_max(v: f32, lid: u32) -> f32 {
  let n = subgroupAdd(1u);
  var m = v;
  for (var k = n / 2u; k > 0u; k >>= 1u) { m = max_or_nan(m, subgroupShuffleXor(m, k)); }
  return reduce_subgroups(m, lid, true);
}
`;
