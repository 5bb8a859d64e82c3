/**
 * The face of gpu/ for kernel authors outside it (amp/kernels/,
 * optim/kernels/): kernels as data, dtypes, the shared WGSL building blocks
 * and the multi-tensor helpers. A kernel takes and returns `DeviceArray`s,
 * never tensors: the ops that put results on the tape are `gpu/mod.ts`'s.
 *
 * @module
 */
export { DTypeError } from "../base/errors.ts";
export { type DType, isHalf } from "../base/dtype.ts";
export type { Gpu } from "../device/gpu.ts";
export { DeviceArray } from "../device/device_array.ts";
export {
  BF16_WGSL,
  type Binding,
  defineKernel,
  type DispatchUniforms,
  type KernelDefinition,
  type LiveUniforms,
  optional,
} from "../device/kernel.ts";
export { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./wgsl/grid.ts";
export { REDUCE_THREADS, WGSL_WORKGROUP_REDUCE } from "./wgsl/math.ts";
export { WGSL_RANDOM } from "./wgsl/random.ts";
export { useSubgroups, WGSL_SUBGROUP_REDUCE } from "./wgsl/subgroups.ts";
export {
  MAX_TENSOR_SLOTS,
  multiTensorDispatches,
  SLOT_UNIFORMS,
  slotBindings,
  slotBuffers,
  type SlotField,
  wgslForEachSlot,
} from "./multi_tensor.ts";
