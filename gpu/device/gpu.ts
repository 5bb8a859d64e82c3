/**
 * The GPU device and everything that lives as long as it: the buffer pool,
 * the pipeline cache and the command batch. The device keeps facts about the
 * adapter (its profile, f16, subgroups, the loop cap); tuning settings belong
 * to the kernel family whose tuner owns them (gpu/tuning/settings.ts: matmul tilings
 * and split-K in `matmulSettings`, attention plans in `attentionSettings`,
 * `multiTensorSettings`, `rowSettings`, `elementwiseSettings`).
 */
import { BufferPool, type MemoryStats, POOL_USAGE } from "./buffer_pool.ts";
import { CommandBatch, type FlushPolicy } from "./command_batch.ts";
import { boundBytes, type DispatchCost, DispatchProfiler, type ProfileTiming } from "./profiler.ts";
import { type ProfileReport, profileReport } from "./profile_report.ts";
import {
  bindingValues,
  type CompiledKernel,
  type DispatchBuffers,
  type DispatchUniforms,
  type KernelConfig,
  type KernelDefinition,
  type LiveUniforms,
  PipelineCache,
} from "./kernel.ts";
import { fail, GpuError, StateError, ValueError } from "../base/errors.ts";
import { type AdapterProfile, adapterProfileOf } from "./adapter_profile.ts";
import type { Backend } from "./backend.ts";
import { type SubgroupMatrixConfig, subgroupMatrixConfigsOf } from "./subgroup_matrix_configs.ts";

/** How to treat f16: use it when the adapter has it, insist on it, or never use it. */
export type F16Mode = "auto" | "require" | "off";

/** Options of {@link Gpu.profile}. */
export interface ProfileOptions {
  /** Print the table with `console.log` (default true). */
  print?: boolean;
  /**
   * `"timestamp"`: GPU timestamps per dispatch (needs `timestamp-query`);
   * `"wall"`: wall time per submit, split over its dispatches. Default: timestamps where available.
   */
  timing?: ProfileTiming;
}

/**
 * Work the library does while its caller waits for the GPU anyway (lazy
 * tuning, gpu/tuning/lazy.ts): run at the end of each wait, after the
 * caller's work has finished. See {@link Gpu.setWaitWork}.
 */
export type WaitWork = (gpu: Gpu) => Promise<void>;

/** Handles to a WebGPU device and the toolkit state bound to it. */
export class Gpu {
  /** The WebGPU device. */
  readonly device: GPUDevice;
  /** The adapter's own description (vendor, architecture, driver). */
  readonly adapterInfo: GPUAdapterInfo;
  /** The WebGPU implementation the device comes from (`initGpu`'s `backend`). */
  readonly backend: Backend;
  /**
   * The adapter's subgroup-matrix shapes (tensor cores) as plain objects;
   * empty unless the device has `chromium-experimental-subgroup-matrix`
   * (Dawn only). The adapter profile carries the same list for kernels.
   */
  readonly subgroupMatrixConfigs: readonly SubgroupMatrixConfig[];
  /**
   * What every adapter-derived choice reads (CPU adapter or GPU, subgroup
   * size, the limits that filter kernels; see `adapter_profile.ts`). Derived
   * from the adapter; tests swap it with `withAdapterProfile`.
   */
  adapterProfile: AdapterProfile;
  /** True when f16 tensors and kernels are available. */
  readonly f16: boolean;
  /**
   * True when the device has the `subgroups` feature (asked for by
   * `initGpu` unless `subgroups: false`): kernels may then reduce within
   * subgroups, as the adapter profile says (`adapterProfile.subgroups`).
   */
  readonly subgroups: boolean;
  /**
   * Whether this device's WGSL front end needs `enable subgroups;` before
   * subgroup builtins (Tint: Dawn, Chrome) or rejects it (naga: Deno's
   * WebGPU), for a device that has subgroups; probed by `initGpu`. Per
   * device, since one process may hold devices of both backends.
   */
  readonly subgroupsDirective: boolean;
  /** True to print generated WGSL as it compiles (the `HALFSTEP_DEBUG` switch). */
  readonly debug: boolean;
  /** Size-class buffer pool; see {@link Gpu.memoryStats}. */
  readonly pool: BufferPool;
  /** Compiled pipelines, keyed by kernel config. */
  readonly pipelines: PipelineCache;
  /** The open batch of commands. */
  readonly batch: CommandBatch;
  /**
   * Loop iterations one shader invocation may run: lavapipe stops it after
   * 65535 (see `gpu/kernels/loop_limit.ts`); Infinity on other adapters.
   */
  readonly loopIterationLimit: number;
  /** The lower of maxBufferSize and maxStorageBufferBindingSize, and which: read once (Dawn's getters cross into native code). */
  readonly #bufferLimit: readonly [string, number];
  #failure: GpuError | null = null;
  /** Errors of single ops (a kernel that failed to compile), thrown at the next sync point. */
  #opErrors: GpuError[] = [];
  /** Kernels dispatched at least once. */
  #tried = new WeakSet<object>();
  #destroyed = false;
  #waitWork: WaitWork | null = null;
  /** True while the wait work runs: its own waits do not start it again. */
  #waitWorking = false;

  /** Wraps a device; use {@link initGpu} rather than calling this yourself. */
  constructor(
    device: GPUDevice,
    adapterInfo: GPUAdapterInfo,
    options: {
      f16: boolean;
      debug: boolean;
      flushPolicy: FlushPolicy;
      subgroupsDirective?: boolean;
      backend?: Backend;
    },
  ) {
    this.device = device;
    this.adapterInfo = adapterInfo;
    this.backend = options.backend ?? "builtin";
    this.subgroupMatrixConfigs = subgroupMatrixConfigsOf(adapterInfo, device.features);
    this.f16 = options.f16;
    this.subgroups = device.features.has("subgroups");
    this.subgroupsDirective = this.subgroups && (options.subgroupsDirective ?? false);
    this.debug = options.debug;
    this.adapterProfile = adapterProfileOf(
      adapterInfo,
      device.limits,
      this.subgroups,
      this.subgroupMatrixConfigs,
    );
    // Less a margin for the fixed loops around the ones kernels check. Not part
    // of the profile: it is a limit of the driver that executes the kernels.
    this.loopIterationLimit = /llvmpipe/i.test(this.adapterName) ? 65535 - 1024 : Infinity;
    const { maxBufferSize, maxStorageBufferBindingSize } = device.limits;
    this.#bufferLimit = maxBufferSize < maxStorageBufferBindingSize
      ? ["maxBufferSize", maxBufferSize]
      : ["maxStorageBufferBindingSize", maxStorageBufferBindingSize];
    this.pool = new BufferPool(
      (bytes, label) => this.#createBuffer(bytes, label),
      () => {
        this.batch?.flush();
        this.batch?.clearBindGroups();
      },
    );
    this.pipelines = new PipelineCache(device, (key, wgsl) => {
      if (this.debug) console.error(`[halfstep] compiling ${key}\n${wgsl}`);
    }, this.subgroupsDirective);
    this.batch = new CommandBatch(device, options.flushPolicy, (message, kernels) => {
      // A submit failed validation (a kernel that did not compile): its ops have
      // undefined outputs and the next sync point says so; the device stays usable.
      const failed = kernels.map((k) => k.compiled).find((c) => c.state === "failed");
      this.#opErrors.push(
        failed?.state === "failed" ? failed.error : new GpuError(
          `a submitted batch of ${kernels.length} kernels (${
            kernels.map((k) => k.key).join(", ").slice(0, 200)
          }) failed: ${message}. Their outputs are undefined; the device stays usable.`,
        ),
      );
    });
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
   * by name (see `defineKernel`); `workgroups` is the grid. `live` gives the
   * uniform fields that change from step to step (a learning rate, a
   * dropout range) for a captured step to recompute at each replay. No sync.
   */
  dispatch<B extends string, U extends string>(
    kernel: CompiledKernel<B, U>,
    buffers: DispatchBuffers<B>,
    uniforms: DispatchUniforms<U>,
    workgroups: readonly [number, number?, number?],
    cost: DispatchCost = {},
    live: LiveUniforms<U> | null = null,
  ): void {
    this.throwIfFailed();
    const status = kernel.compiled;
    if (status.state === "failed") {
      // Nothing executes on Dawn's null backend: a compile check goes on past a kernel that
      // failed (its failure was reported at the sync point after its first dispatch).
      if (this.backend === "dawn-null") return;
      throw status.error;
    }
    const values = bindingValues(kernel, buffers, uniforms);
    // Bytes default to the tensors bound: the flush policy and the profiler use them.
    const bytes = cost.bytes ?? boundBytes(buffers);
    const record = () =>
      this.batch.dispatch(
        kernel as CompiledKernel,
        values.buffers,
        values.words,
        workgroups,
        { ...cost, bytes },
        live,
      );
    if (status.state === "ok") return record();
    // The first dispatch of a kernel not yet known to compile goes alone into
    // its own submit, so a kernel that fails costs only its own op; until it is
    // known, what recording it raises (a bind group on a layout the device
    // refused) is that op's error too, not the device's.
    const first = !this.#tried.has(kernel);
    if (first) {
      this.#tried.add(kernel);
      this.batch.flush();
    }
    this.device.pushErrorScope("validation");
    record();
    this.device.popErrorScope().then((error) => {
      if (error) {
        this.#opErrors.push(new GpuError(`dispatching ${kernel.key} failed: ${error.message}`));
      }
    });
    if (first) this.batch.flush();
  }

  /**
   * Runs `fn` (sync or async) with every dispatch timed, and returns (and by
   * default prints) a table of GPU time by kernel family and config, sorted
   * by time: calls, total, mean, share, GB/s and TFLOP/s where known, as
   * `torch.profiler`'s `key_averages()`. **A sync point**: it waits for the
   * GPU at the end. While profiling, each dispatch runs in a compute pass of
   * its own, which adds a little GPU time.
   *
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { initGpu, matmul, Tensor, tidy } from "../../mod.ts";
   * const gpu = await initGpu({ matmulTiling: "default" });
   * const a = Tensor.full([64, 64], 1);
   * const report = await gpu.profile(() => tidy(() => void matmul(a, a)), { print: false });
   * assert.equal(report.rows[0].kernel, "matmul");
   * assert.equal(report.rows[0].calls, 1);
   * gpu.destroy();
   * ```
   */
  async profile(fn: () => unknown, options: ProfileOptions = {}): Promise<ProfileReport> {
    this.throwIfFailed();
    if (this.batch.profiler) {
      fail(StateError, "Gpu.profile", "a profile is already running; profiles do not nest.");
    }
    const hasTimestamps = this.device.features.has("timestamp-query");
    const timing = options.timing ?? (hasTimestamps ? "timestamp" : "wall");
    if (timing === "timestamp" && !hasTimestamps) {
      fail(ValueError, "Gpu.profile", `the adapter (${this.adapterName}) has no timestamp-query.`);
    }
    this.batch.flush(); // earlier work is not part of the profile
    const profiler = new DispatchProfiler(this.device, timing);
    this.batch.profiler = profiler;
    const started = performance.now();
    let failure: unknown = null;
    try {
      await fn();
    } catch (e) {
      failure = e;
    } finally {
      this.batch.flush();
      this.batch.profiler = null;
    }
    const records = await profiler.finish();
    if (failure !== null) throw failure;
    const report = profileReport(records, {
      timing,
      adapter: this.adapterName,
      wallMs: performance.now() - started,
    });
    if (options.print ?? true) console.log(report.table());
    return report;
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
    this.#throwOpError();
    await this.#afterWait();
  }

  /** Reads a buffer back. A sync point (see {@link CommandBatch.read}). */
  async readBuffer(buffer: GPUBuffer, bytes: number): Promise<ArrayBuffer> {
    this.throwIfFailed();
    const data = await this.batch.read(buffer, bytes);
    this.throwIfFailed();
    this.#throwOpError();
    await this.#afterWait();
    return data;
  }

  /**
   * Runs `work` at the end of every wait ({@link Gpu.sync}, reads), once the
   * caller's work has finished and its errors were thrown; null: none.
   * Not during a profile (the work is not the caller's) nor inside the
   * work's own waits. `initGpu` sets lazy tuning here. @internal
   */
  setWaitWork(work: WaitWork | null): void {
    this.#waitWork = work;
  }

  async #afterWait(): Promise<void> {
    const work = this.#waitWork;
    if (!work || this.#waitWorking || this.batch.profiler || this.#destroyed) return;
    this.#waitWorking = true;
    try {
      await work(this);
    } finally {
      this.#waitWorking = false;
    }
  }

  /** Throws (once) the first error a single op reported since the last sync point. */
  #throwOpError(): void {
    const error = this.#opErrors[0];
    this.#opErrors.length = 0;
    if (error) throw error;
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
    if (defaultGpu === this) defaultGpu = null;
  }

  #fail(message: string): void {
    this.#failure ??= new GpuError(message);
  }

  /**
   * Throws a {@link GpuError} from `op` when a buffer of `bytes` for `what`
   * (e.g. `f32 tensor [2, 3]`) exceeds what this adapter allows one buffer to
   * hold and a kernel to bind (the lower of `maxBufferSize` and
   * `maxStorageBufferBindingSize`). Called before anything is allocated, on
   * the host or the GPU; `fix` ends the message. @internal
   */
  assertBufferFits(
    op: string,
    what: string,
    bytes: number,
    fix = "Use smaller tensors (split the batch).",
  ): void {
    const [name, limit] = this.#bufferLimit;
    if (!(bytes <= limit)) {
      fail(
        GpuError,
        op,
        `${what} needs ${bytes} bytes, over this adapter's ${name} of ${limit} bytes. ${fix}`,
      );
    }
  }

  #createBuffer(bytes: number, label: string): GPUBuffer {
    this.throwIfFailed();
    this.assertBufferFits("Gpu", label, bytes);
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

/** The device new tensors use when none is given (the last `initGpu`'s, unless told otherwise). */
let defaultGpu: Gpu | null = null;

/** Makes `gpu` the device that new tensors use by default. */
export function setDefaultGpu(gpu: Gpu): void {
  defaultGpu = gpu;
}

/** The default device; throws a clear error when `initGpu()` has not run. */
export function getGpu(): Gpu {
  const gpu = defaultGpu;
  if (!gpu) {
    fail(
      StateError,
      "getGpu",
      "no GPU device yet: call `await initGpu()` before creating tensors.",
    );
  }
  return gpu;
}
