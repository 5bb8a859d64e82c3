/**
 * Dispatch grids for 1-D work. WebGPU caps each grid dimension (65535 on most
 * adapters), so large counts spill into y; kernels rebuild the linear
 * workgroup index with {@link WGSL_WORKGROUP_INDEX}.
 */

const MAX_PER_DIM = 65535;

/** A grid of at least `workgroups` workgroups, as [x, y]. */
export function grid1d(workgroups: number): [number, number] {
  const n = Math.max(1, workgroups);
  if (n <= MAX_PER_DIM) return [n, 1];
  const y = Math.ceil(n / MAX_PER_DIM);
  return [Math.ceil(n / y), y];
}

/** WGSL expression for the linear workgroup index (needs `wid` and `nwg` builtins). */
export const WGSL_WORKGROUP_INDEX = "(wid.x + wid.y * nwg.x)";

/** Builtin parameters a kernel using {@link WGSL_WORKGROUP_INDEX} declares on `main`. */
export const WGSL_GRID_BUILTINS =
  "@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, " +
  "@builtin(local_invocation_index) lid: u32";
