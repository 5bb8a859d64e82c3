/**
 * Kernels as data: a definition turns a small config (dtype, tile sizes,
 * epilogue, ...) into WGSL. Pipelines are cached under a key derived from that
 * same config, so a key can never disagree with the code it names. Sizes that
 * vary per call go in a uniform buffer of u32 words, never in the config.
 */

/** A config is a flat record of primitives (it becomes part of the cache key). */
export type KernelConfig = Readonly<Record<string, string | number | boolean>>;

/** One kernel family: WGSL as a function of its config. */
export interface KernelDefinition<C extends KernelConfig> {
  /** Family name, shown in errors and debug output. */
  readonly name: string;
  /** The WGSL source for `config`; entry point `main`, bind group 0. */
  wgsl(config: C): string;
}

/** Defines a kernel family (an identity helper that fixes the config type). */
export function defineKernel<C extends KernelConfig>(
  definition: KernelDefinition<C>,
): KernelDefinition<C> {
  return definition;
}

/** The pipeline cache key for `config` of `definition`: name plus sorted config entries. */
export function kernelKey<C extends KernelConfig>(
  definition: KernelDefinition<C>,
  config: C,
): string {
  const entries = Object.keys(config).sort().map((k) => `${k}=${config[k]}`);
  return `${definition.name}{${entries.join(",")}}`;
}

/** The bits of an f32 as a u32 uniform word (kernels `bitcast<f32>` it back). */
export function f32Bits(x: number): number {
  F32[0] = x;
  return U32[0];
}
const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** A compiled kernel ready to dispatch. */
export interface CompiledKernel {
  /** The cache key (see {@link kernelKey}). */
  readonly key: string;
  /** The compute pipeline. */
  readonly pipeline: GPUComputePipeline;
  /** Its bind group 0 layout. */
  readonly layout: GPUBindGroupLayout;
}

/** Compiles pipelines on first use and keeps them for the life of the device. */
export class PipelineCache {
  #pipelines = new Map<string, CompiledKernel>();
  #device: GPUDevice;
  #onCompile: (key: string, wgsl: string) => void;

  /** A cache for `device`; `onCompile` sees each new key and its WGSL (debug output). */
  constructor(device: GPUDevice, onCompile: (key: string, wgsl: string) => void) {
    this.#device = device;
    this.#onCompile = onCompile;
  }

  /** The pipeline for `config`, compiling it the first time. */
  get<C extends KernelConfig>(definition: KernelDefinition<C>, config: C): CompiledKernel {
    const key = kernelKey(definition, config);
    let compiled = this.#pipelines.get(key);
    if (!compiled) {
      const code = definition.wgsl(config);
      this.#onCompile(key, code);
      const module = this.#device.createShaderModule({ label: key, code });
      const pipeline = this.#device.createComputePipeline({
        label: key,
        layout: "auto",
        compute: { module, entryPoint: "main" },
      });
      compiled = { key, pipeline, layout: pipeline.getBindGroupLayout(0) };
      this.#pipelines.set(key, compiled);
    }
    return compiled;
  }

  /** Number of distinct pipelines compiled so far. */
  get size(): number {
    return this.#pipelines.size;
  }
}
