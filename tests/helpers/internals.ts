/**
 * The internals that tests of one wing take from another (a tuner switched to a GPU's
 * profile, an adapter's subgroup-matrix config, a kernel to compare with), in one place:
 * a test imports internals only of the wing its folder names, and everything else from
 * the faces or from here (tests/package/layering_test.ts checks it), so a move inside the
 * library rewrites this file, not the tests.
 *
 * @module
 */
export { launchUnscaleInto } from "../../amp/kernels/grad_scaler.ts";
export { sizeClass } from "../../gpu/device/buffer_pool.ts";
export { withSubgroupsDirective } from "../../gpu/device/kernel.ts";
export {
  f16MatrixConfig,
  type SubgroupMatrixConfig,
} from "../../gpu/device/subgroup_matrix_configs.ts";
export {
  attentionPlanCandidates,
  launchFlashAttention,
} from "../../gpu/kernels/attention/flash_attention.ts";
export { launchCopy, launchUnary, unaryKernel } from "../../gpu/kernels/elementwise.ts";
export { subgroupMatrixCandidates } from "../../gpu/kernels/gemm/candidates.ts";
export { useCachedMatmulTilings } from "../../gpu/kernels/gemm/class_tuner.ts";
export { gemmSlices, gemmSplit, sliceLength } from "../../gpu/kernels/gemm/gemm.ts";
export { tilingFits, tilingKind } from "../../gpu/kernels/gemm/tilings.ts";
export { slotsPerDispatch } from "../../gpu/kernels/multi_tensor.ts";
export {
  forgetMatmulShapes,
  matmulShapeKey,
  shapeCacheKey,
} from "../../gpu/kernels/gemm/shape_picks.ts";
export { launchReduce } from "../../gpu/kernels/reduce.ts";
export { gpuLikeProfile, withAdapterProfile } from "../../gpu/tuning/profile_switch.ts";
export { tuningStore } from "../../gpu/tuning/store.ts";
export { secondsPerRun } from "../../gpu/tuning/timing.ts";
export { adamKernel } from "../../optim/kernels/update.ts";
