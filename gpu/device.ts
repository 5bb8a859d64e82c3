/**
 * The GPU device and everything that lives as long as it: the buffer pool,
 * the pipeline cache, the command batch and the chosen matmul tiling.
 */
import { BufferPool, type MemoryStats, POOL_USAGE } from "./buffer_pool.ts";
import { CommandBatch } from "./command_batch.ts";
import {
  bindingValues,
  type CompiledKernel,
  type DispatchBuffers,
  type DispatchUniforms,
  type KernelConfig,
  type KernelDefinition,
  PipelineCache,
} from "./kernel.ts";
import { fail, GpuError, StateError } from "./errors.ts";
import { runtime } from "./runtime_state.ts";

/** How to treat f16: use it when the adapter has it, insist on it, or never use it. */
export type F16Mode = "auto" | "require" | "off";

/** Per-thread and per-workgroup tile sizes of the matmul kernel. */
export interface MatmulTiling extends Record<string, string | number | boolean> {
  /**
   * `"register"`: each thread keeps a contiguous TM×TN block in registers,
   * loading from storage; `"interleaved"`: the same with the thread's rows and
   * columns strided across the workgroup, so neighbouring threads load
   * neighbouring addresses (both suit CPU adapters); `"shared"`: workgroup
   * shared-memory tiles (the usual winner on GPUs).
   */
  variant: "register" | "interleaved" | "shared";
  /** Output rows per thread. */
  tm: number;
  /** Output columns per thread. */
  tn: number;
  /** Workgroup threads along columns. */
  wgx: number;
  /** Workgroup threads along rows. */
  wgy: number;
  /** K-slice staged per shared-memory step (shared variant only). */
  tk: number;
}

/** Handles to a WebGPU device and the toolkit state bound to it. */
export class Gpu {
  /** The WebGPU device. */
  readonly device: GPUDevice;
  /** The adapter's own description (vendor, architecture, driver). */
  readonly adapterInfo: GPUAdapterInfo;
  /** True when f16 tensors and kernels are available. */
  readonly f16: boolean;
  /** True to print generated WGSL as it compiles (the `HALFSTEP_DEBUG` switch). */
  readonly debug: boolean;
  /** Size-class buffer pool; see {@link Gpu.memoryStats}. */
  readonly pool: BufferPool;
  /** Compiled pipelines, keyed by kernel config. */
  readonly pipelines: PipelineCache;
  /** The open batch of commands. */
  readonly batch: CommandBatch;
  /** Tiling used by every matmul; chosen by a measured search or by the user. */
  matmulTiling: MatmulTiling;
  #failure: GpuError | null = null;
  #destroyed = false;

  /** Wraps a device; use {@link initGpu} rather than calling this yourself. */
  constructor(
    device: GPUDevice,
    adapterInfo: GPUAdapterInfo,
    options: { f16: boolean; debug: boolean; matmulTiling: MatmulTiling },
  ) {
    this.device = device;
    this.adapterInfo = adapterInfo;
    this.f16 = options.f16;
    this.debug = options.debug;
    this.matmulTiling = options.matmulTiling;
    this.pool = new BufferPool((bytes, label) => this.#createBuffer(bytes, label));
    this.pipelines = new PipelineCache(device, (key, wgsl) => {
      if (this.debug) console.error(`[halfstep] compiling ${key}\n${wgsl}`);
    });
    this.batch = new CommandBatch(device);
    device.lost.then((info) => {
      if (!this.#destroyed) {
        this.#fail(
          `The GPU device was lost (${info.reason}: ${info.message}). ` +
            "Create a new one with initGpu(); tensors of the old device cannot be used.",
        );
      }
    });
    device.addEventListener("uncapturederror", (event) => {
      this.#fail(`A GPU command failed: ${(event as GPUUncapturedErrorEvent).error.message}`);
    });
  }

  /** The adapter's description, for logs and benchmark records. */
  get adapterName(): string {
    const i = this.adapterInfo;
    return i.description || [i.vendor, i.architecture, i.device].filter(Boolean).join(" ") ||
      "unknown adapter";
  }

  /** Memory statistics of the buffer pool. Reads no GPU state (no sync). */
  memoryStats(): MemoryStats {
    return this.pool.stats();
  }

  /** Starts a new peak-memory measurement. */
  resetPeakMemory(): void {
    this.pool.resetPeak();
  }

  /** The compiled pipeline of `definition` for `config` (compiled on first use). */
  kernel<C extends KernelConfig, B extends string, U extends string>(
    definition: KernelDefinition<C, B, U>,
    config: C,
  ): CompiledKernel<B, U> {
    return this.pipelines.get(definition, config);
  }

  /**
   * Records a dispatch of `kernel` with its buffers and uniform values given
   * by name (see `defineKernel`); `workgroups` is the grid. No sync.
   */
  dispatch<B extends string, U extends string>(
    kernel: CompiledKernel<B, U>,
    buffers: DispatchBuffers<B>,
    uniforms: DispatchUniforms<U>,
    workgroups: readonly [number, number?, number?],
  ): void {
    this.throwIfFailed();
    const values = bindingValues(kernel, buffers, uniforms);
    this.batch.dispatch(kernel as CompiledKernel, values.buffers, values.words, workgroups);
  }

  /** Submits recorded work without waiting for it. */
  flush(): void {
    this.throwIfFailed();
    this.batch.flush();
  }

  /**
   * Waits until the GPU has finished all submitted work. A sync point: costs
   * a full queue drain, so use it in benchmarks, not in training steps.
   */
  async sync(): Promise<void> {
    this.flush();
    await this.device.queue.onSubmittedWorkDone();
    this.throwIfFailed();
  }

  /** Reads a buffer back. A sync point (see {@link CommandBatch.read}). */
  async readBuffer(buffer: GPUBuffer, bytes: number): Promise<ArrayBuffer> {
    this.throwIfFailed();
    const data = await this.batch.read(buffer, bytes);
    this.throwIfFailed();
    return data;
  }

  /** Throws the first error the device reported (lost device, OOM, failed kernel). */
  throwIfFailed(): void {
    if (this.#failure) throw this.#failure;
    if (this.#destroyed) {
      fail(StateError, "Gpu", "this device was destroyed; create a new one with initGpu().");
    }
  }

  /** Frees every buffer and the device. Tensors of this device become unusable. */
  destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.batch.flush();
    this.pool.destroyAll();
    this.batch.destroy();
    this.device.destroy();
    if (runtime.defaultGpu === this) runtime.defaultGpu = null;
  }

  #fail(message: string): void {
    this.#failure ??= new GpuError(message);
  }

  #createBuffer(bytes: number, label: string): GPUBuffer {
    this.throwIfFailed();
    const limit = this.device.limits.maxStorageBufferBindingSize;
    if (bytes > limit) {
      fail(
        GpuError,
        "Gpu",
        `cannot allocate ${label}: ${bytes} bytes exceeds this adapter's ` +
          `maxStorageBufferBindingSize of ${limit} bytes. Use smaller tensors (split the batch).`,
      );
    }
    this.device.pushErrorScope("out-of-memory");
    this.device.pushErrorScope("validation");
    const buffer = this.device.createBuffer({ label, size: bytes, usage: POOL_USAGE });
    this.device.popErrorScope().then((e) => {
      if (e) this.#fail(`Allocating ${label} (${bytes} bytes) failed: ${e.message}`);
    });
    this.device.popErrorScope().then((e) => {
      if (e) {
        this.#fail(
          `Out of GPU memory while allocating ${label} (${bytes} bytes). ` +
            "Lower the batch size, use f16 (autocast) or gradient checkpointing.",
        );
      }
    });
    return buffer;
  }
}

/** Makes `gpu` the device that new tensors use by default. */
export function setDefaultGpu(gpu: Gpu): void {
  runtime.defaultGpu = gpu;
}

/** The default device; throws a clear error when `initGpu()` has not run. */
export function getGpu(): Gpu {
  const gpu = runtime.defaultGpu;
  if (!gpu) {
    fail(
      StateError,
      "getGpu",
      "no GPU device yet: call `await initGpu()` before creating tensors.",
    );
  }
  return gpu;
}
