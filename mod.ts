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
 * import assert from "node:assert/strict";
 * import { initGpu, matmul, sum, Tensor } from "./mod.ts";
 * const gpu = await initGpu();
 * const a = Tensor.from([1, 2, 3, 4], [2, 2], { requiresGrad: true });
 * const loss = sum(matmul(a, a));
 * loss.backward();
 * // d/da sum(a·a) = 1·aᵀ + aᵀ·1: a's row sums (3, 7) across, plus its column sums (4, 6) down
 * assert.equal((await a.grad!.read()).join(), "7,11,9,13");
 * gpu.destroy(); // frees every buffer and the device
 * ```
 *
 * @module
 */

// gpu/: the device, tensors, the tape and the ops (its internals stay on `./gpu`).
export {
  adaptiveAvgPool2d,
  type AdaptiveSize2d,
  add,
  addInPlace,
  addScalar,
  avgPool2d,
  type AvgPool2dOptions,
  backward,
  type BackwardOptions,
  batchNorm,
  type BatchNormOptions,
  cast,
  causalSoftmax,
  type CausalSoftmaxOptions,
  checkpoint,
  conv2d,
  type Conv2dOptions,
  div,
  dropout,
  type DType,
  DTypeError,
  embedding,
  enableGrad,
  exp,
  flatten,
  type FloatDType,
  fusedCausalAttention,
  type FusedCausalAttentionOptions,
  fusedCausalAttentionPacked,
  gelu,
  type GeluOptions,
  Gpu,
  GpuError,
  HalfstepError,
  initGpu,
  type InitGpuOptions,
  isGradEnabled,
  keep,
  layerNorm,
  layerNormLinear,
  type LayerNormLinearOptions,
  type LayerNormOptions,
  linear,
  type LinearOptions,
  log,
  logSoftmax,
  matmul,
  type MatmulOptions,
  max,
  maxPool2d,
  type MaxPool2dIndicesOptions,
  type MaxPool2dOptions,
  mean,
  mul,
  narrow,
  neg,
  noGrad,
  permute,
  type ProfileReport,
  RandomGenerator,
  type RandomRange,
  type RandomState,
  type ReduceOptions,
  relu,
  reshape,
  scale,
  type Shape,
  ShapeError,
  type Size2d,
  softmax,
  split,
  sqrt,
  square,
  StateError,
  sub,
  sum,
  Tensor,
  type TensorData,
  type TensorOptions,
  type TensorValues,
  tidy,
  ValueError,
} from "./gpu/mod.ts";

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
  Dropout,
  Embedding,
  Flatten,
  GELU,
  LayerNorm,
  type LayerNormLayerOptions,
  Linear,
  type LinearLayerOptions,
  type LoadStateOptions,
  MaxPool2d,
  Module,
  mseLoss,
  type Reduction,
  ReLU,
  SafetensorsError,
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
