/**
 * The GPU runtime, whole, wing by wing (ARCHITECTURE.md): base types and
 * errors, the device (Gpu, device arrays, the buffer pool, kernels as data,
 * command batching, the profiler), tuning, the kernel families' settings and
 * tuners, tensors with the tape, scopes and the runtime state's seams, and
 * the ops. The root `mod.ts` re-exports what training code calls; this entry
 * point (`./gpu`) adds the internals for people writing kernels and ops.
 *
 * `await t.read()`, `await t.item()` and `await gpu.sync()` are the only calls
 * that wait for the GPU; everything else records work and returns at once.
 *
 * @module
 */
// device acquisition
export { defaultFlushPolicy, initGpu, type InitGpuOptions } from "./init.ts";

// the base: errors, dtypes, shapes, the op registry
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
} from "./base/errors.ts";
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
} from "./base/op_registry.ts";
export { warnOnce } from "./base/warn_once.ts";
export {
  assertDType,
  bytesPerElement,
  type DType,
  DTYPES,
  type FloatDType,
  isHalf,
  TENSOR_DTYPES,
  wgslType,
} from "./base/dtype.ts";
export { BF16_NAN, bf16FromF32, f32FromBf16 } from "./base/bf16.ts";
export { assertValidShape, sameShape, type Shape, shapeString, sizeOf } from "./base/shape.ts";
export { cut, quoted, shortValue } from "./base/short_text.ts";

// the device: Gpu, device arrays, the buffer pool, kernels as data, batching, profiling
export {
  type F16Mode,
  getGpu,
  Gpu,
  type ProfileOptions,
  setDefaultGpu,
  type WaitWork,
} from "./device/gpu.ts";
export type { AdapterProfile, ProfileLimits } from "./device/adapter_profile.ts";
export { type Backend, BACKENDS } from "./device/backend.ts";
export {
  SUBGROUP_MATRIX_FEATURE,
  SUBGROUP_SIZE_CONTROL_FEATURE,
  type SubgroupMatrixConfig,
  type SubgroupSizing,
} from "./device/subgroup_matrix_configs.ts";
export { DAWN_FLAGS, DAWN_NULL_FLAGS, DAWN_PACKAGE } from "./device/backend_dawn.ts";
export {
  type AdapterDescription,
  describedAdapter,
  type DescribedMatrixConfig,
} from "./device/described_adapter.ts";
export { KNOWN_ADAPTERS } from "./device/known_adapters.ts";
export {
  type DispatchCost,
  DispatchProfiler,
  type DispatchRecord,
  type ProfileTiming,
} from "./device/profiler.ts";
export type { ProfileReport, ProfileRow } from "./device/profile_report.ts";
export { BufferPool, type MemoryStats, PoolReserve } from "./device/buffer_pool.ts";
export { type BatchCounters, CommandBatch, type FlushPolicy } from "./device/command_batch.ts";
export {
  CommandRecording,
  firstDifference,
  type RecordedCommand,
  type RecordedCopy,
  type RecordedDispatch,
  type RecordedWrite,
} from "./device/command_recording.ts";
export {
  CommandGraph,
  type GraphCommand,
  type GraphCopy,
  type GraphDispatch,
} from "./device/command_graph.ts";
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
  type LiveUniforms,
  optional,
  PipelineCache,
  type UniformFields,
  type UniformType,
} from "./device/kernel.ts";
export {
  ArrayStorage,
  type ArrayValues,
  assertArrayFits,
  bufferBytes,
  DeviceArray,
} from "./device/device_array.ts";

// tuning: settings, timing, picks
export type { CandidateTimer, TuningProgress } from "./tuning/timing.ts";
export type { TimedPick } from "./tuning/cache.ts";
export type { ClassTuningOptions, ShapePicks, ShapeTuningOptions } from "./tuning/picks.ts";
export {
  defineTunerSettings,
  settingsChanged,
  settingsEpoch,
  type TunerSettings,
} from "./tuning/settings.ts";
export {
  LAZY_MIN_WORK,
  LAZY_TUNING_BUDGET,
  type LazyRunner,
  type LazyTuning,
  lazyTuning,
  type PendingTuning,
  pendingTuning,
  tunePending,
  type TuningBudget,
  type TuningMode,
} from "./tuning/lazy.ts";

// kernel families: settings, tuners, vocabulary
export {
  type ClassTuning,
  defaultTuningClasses,
  MATMUL_CANDIDATES,
  matmulCandidates,
  type TilingMeasurement,
  tuneMatmul,
  type TuneMatmulOptions,
} from "./kernels/gemm/class_tuner.ts";
export {
  type MatmulShape,
  matmulShapeReport,
  SHAPE_TRIAL_BUDGET,
  type ShapePick,
  type ShapeTuning,
  tuneMatmulShapes,
  type TuneMatmulShapesOptions,
} from "./kernels/gemm/shape_tuner.ts";
export type { Activation } from "./kernels/wgsl/math.ts";
export {
  attentionShapeReport,
  type AttentionShapeTuning,
  type AttentionTuning,
  tuneAttention,
  type TuneAttentionOptions,
  tuneAttentionShapes,
  type TuneAttentionShapesOptions,
} from "./kernels/attention/tuner.ts";
export type { AttentionPlan } from "./kernels/attention/plans.ts";
export type { AttentionMatrix } from "./kernels/attention/flash_attention_subgroup_matrix.ts";
export type { AttentionTile } from "./kernels/attention/flash_attention_tiled.ts";
export {
  type F16Accumulation,
  type MatmulSettings,
  matmulSettings,
  type MatmulTiling,
} from "./kernels/gemm/settings.ts";
export {
  type AttentionProblem,
  type AttentionSettings,
  attentionSettings,
  type AttentionShape,
  type AttentionShapeRecord,
} from "./kernels/attention/settings.ts";
export { type MultiTensorSettings, multiTensorSettings } from "./kernels/multi_tensor.ts";
export { type RowSettings, rowSettings } from "./kernels/rows/row_layout.ts";
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
} from "./kernels/gemm/matmul_class.ts";
export type { Broadcast } from "./kernels/elementwise.ts";
export { F16_CHUNK } from "./kernels/gemm/matmul.ts";
export type { Conv2dGeometry } from "./kernels/gemm/conv2d.ts";
export { hashU32, type RandomRange, randomU32, randomUniform } from "./kernels/wgsl/random.ts";

// tensors, the tape, scopes, the runtime state and its seams
export {
  type CastHook,
  currentModes,
  type OpObserver,
  type RandomDraws,
  runtime,
  type RuntimeModes,
  type RuntimeState,
  type StepRecorder,
  withState,
} from "./tensor/runtime_state.ts";
export {
  noteCaptureCheck,
  recheckStep,
  recordStep,
  redrawStep,
  type StepDraw,
  StepRecording,
} from "./tensor/step_recording.ts";
export {
  type BackwardOptions,
  type GradNode,
  type IndexRange,
  Tensor,
  type TensorData,
  type TensorOptions,
  type TensorValues,
} from "./tensor/tensor.ts";
export { keep, type ScopedResource, tidy, tracked, untracked } from "./tensor/scope.ts";
export {
  autocastDtypes,
  autocastInputs,
  autocastInputsWidenedInKernel,
  markCastForOp,
} from "./tensor/autocast_hook.ts";
export {
  backward,
  type BackwardRule,
  enableGrad,
  isGradEnabled,
  noGrad,
  record,
  type RecordSpec,
  zeroGrad,
} from "./tensor/autograd.ts";
export {
  checkRandomState,
  RandomGenerator,
  type RandomState,
  RandomTape,
} from "./tensor/random.ts";

// the ops
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
export { readThroughCopy, scaleLoss, workingCopy } from "./ops/loss_scale.ts";
export { assertTensors } from "./ops/checks.ts";
export { broadcastInto } from "./ops/broadcast.ts";
export { linear, type LinearOptions } from "./ops/linear.ts";
export { layerNormLinear, type LayerNormLinearOptions } from "./ops/layer_norm_linear.ts";
export { matmul, type MatmulOptions } from "./ops/matmul.ts";
export { max, mean, type ReduceOptions, sum } from "./ops/reduce.ts";
export { logSoftmax, softmax } from "./ops/softmax.ts";
export { reshape } from "./ops/reshape.ts";
export { addInPlace, copyInto } from "./ops/in_place.ts";
export { checkpoint, isRecomputing } from "./ops/checkpoint.ts";
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
  resolveAdaptiveSize,
  type ResolvedPool2dOptions,
  resolvePool2dOptions,
} from "./ops/pool2d.ts";
export { checkFlattenDims, flatten } from "./ops/flatten.ts";
export type { Size2d } from "./ops/size2d.ts";
export {
  type CrossEntropyPerRow,
  crossEntropyPerRow,
  type CrossEntropyRowOptions,
} from "./ops/cross_entropy.ts";
export { causalSoftmax, type CausalSoftmaxOptions } from "./ops/causal_softmax.ts";
export { permute } from "./ops/permute.ts";
export { concat, narrow, split } from "./ops/narrow.ts";
export {
  fusedCausalAttention,
  type FusedCausalAttentionOptions,
  fusedCausalAttentionPacked,
} from "./ops/fused_attention.ts";
export {
  LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS,
  type LinearCrossEntropyOptions,
  linearCrossEntropyPerRow,
} from "./ops/linear_cross_entropy.ts";
