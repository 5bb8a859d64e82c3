/**
 * The GPU runtime: device acquisition, buffer pool and memory statistics,
 * kernels, command batching, tensors and the autograd tape.
 *
 * `await t.read()`, `await t.item()` and `await gpu.sync()` are the only calls
 * that wait for the GPU; everything else records work and returns at once.
 *
 * @module
 */
export { initGpu, type InitGpuOptions } from "./init.ts";
export { type F16Mode, getGpu, Gpu, GpuError, type MatmulTiling, setDefaultGpu } from "./device.ts";
export { BufferPool, type MemoryStats } from "./buffer_pool.ts";
export { type BatchCounters, CommandBatch } from "./command_batch.ts";
export {
  type CompiledKernel,
  defineKernel,
  type KernelConfig,
  type KernelDefinition,
  kernelKey,
  PipelineCache,
} from "./kernel.ts";
export { bytesPerElement, type DType, DTYPES, type FloatDType } from "./dtype.ts";
export { type Shape, shapeString, sizeOf } from "./shape.ts";
export { type IndexRange, Tensor, type TensorData, type TensorOptions } from "./tensor.ts";
export { keep, type ScopedResource, tidy, untracked } from "./scope.ts";
export { autocastInputs, type CastHook, currentCastHook, setCastHook } from "./autocast_hook.ts";
export {
  backward,
  type BackwardOptions,
  type BackwardRule,
  enableGrad,
  GradNode,
  isGradEnabled,
  noGrad,
  record,
} from "./autograd.ts";
export {
  MATMUL_CANDIDATES,
  type TilingMeasurement,
  tuneMatmul,
  type TuningResult,
} from "./matmul_tuning.ts";
export {
  add,
  addScalar,
  cast,
  div,
  exp,
  gelu,
  log,
  mul,
  neg,
  relu,
  scale,
  sqrt,
  square,
  sub,
} from "./ops/elementwise.ts";
export { linear, type LinearOptions, matmul, type MatmulOptions } from "./ops/matmul.ts";
export { max, mean, type ReduceOptions, sum } from "./ops/reduce.ts";
export { logSoftmax, softmax } from "./ops/softmax.ts";
export { reshape } from "./ops/reshape.ts";
export { addInPlace } from "./ops/in_place.ts";
export { checkpoint, isRecomputing } from "./checkpoint.ts";
export { layerNorm, type LayerNormOptions } from "./ops/layer_norm.ts";
export { batchNorm, type BatchNormOptions } from "./ops/batch_norm.ts";
export { dropout } from "./ops/dropout.ts";
export { embedding } from "./ops/embedding.ts";
export { crossEntropyPerRow } from "./ops/cross_entropy.ts";
export { hashU32, RandomGenerator, type RandomRange, randomU32, randomUniform } from "./random.ts";
export { causalSoftmax, type CausalSoftmaxOptions } from "./ops/causal_softmax.ts";
export { permute } from "./ops/permute.ts";
