/**
 * The GPU runtime, whole: device acquisition, buffer pool and memory
 * statistics, kernels as data and the pipeline cache, command batching,
 * tensors, the op registry, the runtime state, the autograd tape and
 * checkpoint recompute, and the ops. The root `mod.ts` re-exports what
 * training code calls; this entry point (`./gpu`) adds the internals for
 * people writing kernels and ops.
 *
 * `await t.read()`, `await t.item()` and `await gpu.sync()` are the only calls
 * that wait for the GPU; everything else records work and returns at once.
 *
 * @module
 */
export { defaultFlushPolicy, initGpu, type InitGpuOptions } from "./init.ts";
export {
  type F16Accumulation,
  type F16Mode,
  getGpu,
  Gpu,
  type MatmulTiling,
  type ProfileOptions,
  setDefaultGpu,
} from "./device.ts";
export type { AdapterProfile, ProfileLimits } from "./adapter_profile.ts";
export type { SubgroupMatrixConfig } from "./subgroup_matrix_configs.ts";
export {
  type DispatchCost,
  DispatchProfiler,
  type DispatchRecord,
  type ProfileTiming,
} from "./profiler.ts";
export type { ProfileReport, ProfileRow } from "./profile_report.ts";
export {
  checkOptionNames,
  DTypeError,
  fail,
  GpuError,
  HalfstepError,
  type HalfstepErrorClass,
  ShapeError,
  StateError,
  ValueError,
} from "./errors.ts";
export {
  AUTOCAST_OP_NAMES,
  type AutocastClass,
  type AutocastOpName,
  autocastOpName,
  isOpName,
  OP_NAMES,
  type OpInfo,
  type OpName,
  OPS,
} from "./op_registry.ts";
export {
  currentModes,
  runtime,
  type RuntimeModes,
  type RuntimeState,
  warnOnce,
  withState,
} from "./runtime_state.ts";
export type { OpObserver } from "./op_observer.ts";
export { BufferPool, type MemoryStats } from "./buffer_pool.ts";
export { type BatchCounters, CommandBatch, type FlushPolicy } from "./command_batch.ts";
export {
  type Binding,
  type CompiledKernel,
  defineKernel,
  type DispatchBuffers,
  type DispatchUniforms,
  type ElementType,
  f32Bits,
  type KernelConfig,
  type KernelDefinition,
  kernelKey,
  type KernelSpec,
  optional,
  PipelineCache,
  type UniformFields,
  type UniformType,
} from "./kernel.ts";
export {
  assertDType,
  bytesPerElement,
  type DType,
  DTYPES,
  type FloatDType,
  isHalf,
  TENSOR_DTYPES,
  wgslType,
} from "./dtype.ts";
export { BF16_NAN, bf16FromF32, f32FromBf16 } from "./bf16.ts";
export { type Shape, shapeString, sizeOf } from "./shape.ts";
export {
  type IndexRange,
  Tensor,
  type TensorData,
  type TensorOptions,
  type TensorValues,
} from "./tensor.ts";
export { keep, type ScopedResource, tidy, tracked, untracked } from "./scope.ts";
export {
  autocastDtypes,
  autocastInputs,
  autocastInputsWidenedInKernel,
  type CastHook,
} from "./autocast_hook.ts";
export {
  backward,
  type BackwardOptions,
  type BackwardRule,
  enableGrad,
  GradNode,
  isGradEnabled,
  noGrad,
  record,
  type RecordSpec,
} from "./autograd.ts";
export {
  type ClassTuning,
  defaultTuningClasses,
  MATMUL_CANDIDATES,
  matmulCandidates,
  type TilingMeasurement,
  tuneMatmul,
  type TuneMatmulOptions,
} from "./matmul_tuning.ts";
export {
  type MatmulShape,
  matmulShapeReport,
  SHAPE_TRIAL_BUDGET,
  type ShapePick,
  type ShapeTuning,
  tuneMatmulShapes,
  type TuneMatmulShapesOptions,
} from "./shape_tuning.ts";
export type { Activation } from "./kernels/wgsl_math.ts";
export {
  attentionShapeReport,
  type AttentionShapeTuning,
  type AttentionTuning,
  tuneAttention,
  tuneAttentionShapes,
  type TuneAttentionShapesOptions,
} from "./attention_tuning.ts";
export type { CandidateTimer, TuningProgress } from "./kernel_timing.ts";
export type { ShapePicks, ShapeTuningOptions, TimedPick } from "./shape_picks_store.ts";
export type { AttentionPlan, AttentionTile } from "./device.ts";
export { defineTunerSettings, type TunerSettings } from "./tuners.ts";
export { type MatmulSettings, matmulSettings } from "./matmul_settings.ts";
export {
  type AttentionProblem,
  type AttentionSettings,
  attentionSettings,
  type AttentionShape,
  type AttentionShapeRecord,
} from "./attention_picks.ts";
export { type MultiTensorSettings, multiTensorSettings } from "./kernels/multi_tensor.ts";
export { type RowSettings, rowSettings } from "./kernels/row_layout.ts";
export { type ElementwiseSettings, elementwiseSettings } from "./kernels/elementwise.ts";
export {
  classOf,
  type MatmulClass,
  matmulClassKey,
  type MatmulOrientation,
  type MatmulProblem,
  type MatmulSize,
  type OperandLayout,
  tilingFor,
  tilingName,
  tilingNames,
} from "./matmul_class.ts";
export {
  add,
  addScalar,
  cast,
  div,
  exp,
  gelu,
  type GeluOptions,
  log,
  mul,
  neg,
  relu,
  scale,
  sqrt,
  square,
  sub,
} from "./ops/elementwise.ts";
export { readThroughCopy, scaleLoss } from "./ops/loss_scale.ts";
export { linear, type LinearOptions } from "./ops/linear.ts";
export { layerNormLinear, type LayerNormLinearOptions } from "./ops/layer_norm_linear.ts";
export { matmul, type MatmulOptions } from "./ops/matmul.ts";
export { F16_CHUNK } from "./kernels/matmul.ts";
export { max, mean, type ReduceOptions, sum } from "./ops/reduce.ts";
export { logSoftmax, softmax } from "./ops/softmax.ts";
export { reshape } from "./ops/reshape.ts";
export { addInPlace } from "./ops/in_place.ts";
export { checkpoint, isRecomputing } from "./checkpoint.ts";
export { layerNorm, type LayerNormOptions } from "./ops/layer_norm.ts";
export { batchNorm, batchNormCounter, type BatchNormOptions } from "./ops/batch_norm.ts";
export { dropout } from "./ops/dropout.ts";
export { embedding } from "./ops/embedding.ts";
export { conv2d, conv2dGeometry, type Conv2dOptions } from "./ops/conv2d.ts";
export {
  adaptiveAvgPool2d,
  type AdaptiveSize2d,
  avgPool2d,
  type AvgPool2dOptions,
  maxPool2d,
  type MaxPool2dIndicesOptions,
  type MaxPool2dOptions,
} from "./ops/pool2d.ts";
export { flatten } from "./ops/flatten.ts";
export type { Size2d } from "./ops/size2d.ts";
export type { Conv2dGeometry } from "./kernels/conv2d.ts";
export {
  type CrossEntropyPerRow,
  crossEntropyPerRow,
  type CrossEntropyRowOptions,
} from "./ops/cross_entropy.ts";
export {
  checkRandomState,
  hashU32,
  RandomGenerator,
  type RandomRange,
  type RandomState,
  RandomTape,
  randomU32,
  randomUniform,
} from "./random.ts";
export { causalSoftmax, type CausalSoftmaxOptions } from "./ops/causal_softmax.ts";
export { permute } from "./ops/permute.ts";
export { narrow, split } from "./ops/narrow.ts";
export { fusedCausalAttention, type FusedCausalAttentionOptions } from "./ops/fused_attention.ts";
