/**
 * halfstep: mixed-precision neural-network training on the GPU through
 * WebGPU, for Deno and the web: f16 kernels with f32 accumulation, an
 * autograd tape, fp32 master weights, dynamic and static loss scaling,
 * gradient accumulation and clipping, fused optimizers, gradient
 * checkpointing, layers, losses and state dicts. Everything here uses Web
 * APIs only, so it loads from any URL and in browsers; file helpers are in
 * the `./files` export.
 *
 * This entry point holds what training code calls. The layers' own entry
 * points add their internals: `./gpu` (kernels as data, the pipeline cache,
 * the buffer pool, command batching, the op registry, the runtime state and
 * the cast-hook seam), `./optim`, `./nn` and `./amp`.
 *
 * @example
 * ```ts
 * import { initGpu, matmul, sum, Tensor } from "./mod.ts";
 * const gpu = await initGpu();
 * const a = Tensor.from([1, 2, 3, 4], [2, 2], { requiresGrad: true });
 * const loss = sum(matmul(a, a));
 * loss.backward();
 * console.log(await a.grad!.read());
 * gpu.destroy(); // frees every buffer and the device
 * ```
 *
 * @module
 */

// gpu/: the device, tensors, the tape and the ops.
export { initGpu, type InitGpuOptions } from "./gpu/init.ts";
export {
  type F16Accumulation,
  type F16Mode,
  Gpu,
  type MatmulTiling,
  type ProfileOptions,
} from "./gpu/device.ts";
export type { Backend, SubgroupMatrixConfig } from "./gpu/backend.ts";
export type { FlushPolicy } from "./gpu/command_batch.ts";
export type { ProfileReport, ProfileRow } from "./gpu/profile_report.ts";
export type { MemoryStats } from "./gpu/buffer_pool.ts";
export {
  DTypeError,
  GpuError,
  HalfstepError,
  ShapeError,
  StateError,
  ValueError,
} from "./gpu/errors.ts";
export type { DType, FloatDType } from "./gpu/dtype.ts";
export type { Shape } from "./gpu/shape.ts";
export { Tensor, type TensorData, type TensorOptions, type TensorValues } from "./gpu/tensor.ts";
export { keep, tidy } from "./gpu/scope.ts";
export {
  backward,
  type BackwardOptions,
  enableGrad,
  isGradEnabled,
  noGrad,
} from "./gpu/autograd.ts";
export { checkpoint } from "./gpu/checkpoint.ts";
export { RandomGenerator, type RandomRange, type RandomState } from "./gpu/random.ts";
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
} from "./gpu/ops/elementwise.ts";
export { linear, type LinearOptions } from "./gpu/ops/linear.ts";
export { layerNormLinear, type LayerNormLinearOptions } from "./gpu/ops/layer_norm_linear.ts";
export { matmul, type MatmulOptions } from "./gpu/ops/matmul.ts";
export { F16_CHUNK } from "./gpu/kernels/matmul.ts";
export { max, mean, type ReduceOptions, sum } from "./gpu/ops/reduce.ts";
export { logSoftmax, softmax } from "./gpu/ops/softmax.ts";
export { causalSoftmax, type CausalSoftmaxOptions } from "./gpu/ops/causal_softmax.ts";
export { reshape } from "./gpu/ops/reshape.ts";
export { permute } from "./gpu/ops/permute.ts";
export { narrow, split } from "./gpu/ops/narrow.ts";
export {
  fusedCausalAttention,
  type FusedCausalAttentionOptions,
  fusedCausalAttentionPacked,
} from "./gpu/ops/fused_attention.ts";
export { addInPlace } from "./gpu/ops/in_place.ts";
export { layerNorm, type LayerNormOptions } from "./gpu/ops/layer_norm.ts";
export { batchNorm, batchNormCounter, type BatchNormOptions } from "./gpu/ops/batch_norm.ts";
export { dropout } from "./gpu/ops/dropout.ts";
export { embedding } from "./gpu/ops/embedding.ts";
export { conv2d, type Conv2dOptions } from "./gpu/ops/conv2d.ts";
export {
  adaptiveAvgPool2d,
  type AdaptiveSize2d,
  avgPool2d,
  type AvgPool2dOptions,
  maxPool2d,
  type MaxPool2dIndicesOptions,
  type MaxPool2dOptions,
} from "./gpu/ops/pool2d.ts";
export { flatten } from "./gpu/ops/flatten.ts";
export type { Size2d } from "./gpu/ops/size2d.ts";

// optim/: optimizers, schedules, clipping.
export type {
  Group,
  Optimizer,
  OptimizerStateDict,
  ParamGroup,
  StepSignals,
  WorkingCopies,
} from "./optim/mod.ts";
export {
  Adam,
  type AdamGroup,
  type AdamOptions,
  type AdamParamGroup,
  AdamW,
  clipGradNorm,
  type ClipResult,
  cosineSchedule,
  type CosineScheduleOptions,
  linearWarmupDecay,
  type LinearWarmupDecayOptions,
  type LrSchedule,
  LrScheduler,
  type LrSchedulerState,
  SGD,
  type SGDGroup,
  type SGDOptions,
  type SGDParamGroup,
} from "./optim/mod.ts";

// nn/: modules, layers, losses, checkpointing of layer sequences, safetensors.
export {
  AdaptiveAvgPool2d,
  AvgPool2d,
  BatchNorm,
  BatchNorm1d,
  BatchNorm2d,
  type BatchNormLayerOptions,
  causalAttention,
  type CausalAttentionOptions,
  CausalSelfAttention,
  type CausalSelfAttentionOptions,
  Checkpointed,
  type CheckpointPlan,
  checkpointSequential,
  Conv2d,
  type Conv2dLayerOptions,
  crossEntropy,
  type CrossEntropyOptions,
  decodeSafetensors,
  Dropout,
  Embedding,
  encodeSafetensors,
  Flatten,
  GELU,
  type HostTensor,
  type InitSource,
  LayerNorm,
  type LayerNormLayerOptions,
  Linear,
  type LinearLayerOptions,
  type LoadStateOptions,
  MaxPool2d,
  Module,
  mseLoss,
  type ParameterOptions,
  planCheckpointSegments,
  type Reduction,
  ReLU,
  type SafetensorsEntry,
  SafetensorsError,
  type SafetensorsSpec,
  type SegmentSpec,
  Sequential,
  type StateValue,
  TransformerBlock,
  type TransformerBlockOptions,
} from "./nn/mod.ts";

// amp/: autocast, master weights, loss scaling, the trainer.
export {
  AMP_DTYPES,
  type AmpDType,
  AmpTrainer,
  type AmpTrainerOptions,
  type AmpTrainerState,
  autocast,
  type AutocastLists,
  type AutocastOptions,
  type CastPolicy,
  castPolicyOf,
  compareToF32,
  type CompareToF32Options,
  customAutocastLists,
  type CustomListsOptions,
  DEFAULT_AUTOCAST_LISTS,
  type Drift,
  type DriftReport,
  type FirstNonFinite,
  GradScaler,
  type GradScalerOptions,
  type GradScalerState,
  type HasParameters,
  isStaticLossScale,
  MasterWeights,
  type MasterWeightsOptions,
  type NumericsCounts,
  NumericsInspector,
  type NumericsPhase,
  type NumericsReport,
  type NumericsRow,
  type OpDrift,
  type OpDtypeCount,
  type ParameterDrift,
  type ParameterGradientRow,
  type ReportOptions,
  type TrainerPrecision,
  type WatchOptions,
} from "./amp/mod.ts";
