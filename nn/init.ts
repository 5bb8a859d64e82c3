/** Seeded parameter initialisation (PyTorch's defaults), drawn on the CPU then uploaded. */
import {
  assertArrayFits,
  type FloatDType,
  getGpu,
  type Gpu,
  RandomGenerator,
  type Shape,
  sizeOf,
  Tensor,
} from "../gpu/mod.ts";

/** Where initial values come from: a seed, or a shared generator. */
export type InitSource = number | RandomGenerator;

/** A generator for `source` (a fresh one for a seed). */
export function generatorOf(source: InitSource = 0): RandomGenerator {
  return typeof source === "number" ? new RandomGenerator(source) : source;
}

/** Common options of parameterised layers. */
export interface ParameterOptions {
  /** Seed or generator for the initial values (default seed 0). */
  seed?: InitSource;
  /** Parameter dtype (default f32: master weights are fp32). */
  dtype?: FloatDType;
  /** Device (default: the one `initGpu()` made). */
  gpu?: Gpu;
}

/** A tensor of `shape` with values uniform in [−bound, bound). */
export function uniformTensor(shape: Shape, bound: number, options: ParameterOptions): Tensor {
  assertParameterFits(shape, options);
  const values = generatorOf(options.seed).uniform(sizeOf(shape), -bound, bound);
  return Tensor.from(values, shape, { dtype: options.dtype, gpu: options.gpu });
}

/** A tensor of `shape` with values N(0, std²). */
export function normalTensor(shape: Shape, std: number, options: ParameterOptions): Tensor {
  assertParameterFits(shape, options);
  const values = generatorOf(options.seed).normal(sizeOf(shape), 0, std);
  return Tensor.from(values, shape, { dtype: options.dtype, gpu: options.gpu });
}

/** A clear error before the host draws values for a parameter too large for the device. */
function assertParameterFits(shape: Shape, options: ParameterOptions): void {
  const fix = "Use a smaller layer (fewer features, channels, or embedding rows).";
  assertArrayFits("parameter init", shape, options.dtype ?? "f32", options.gpu ?? getGpu(), fix);
}
