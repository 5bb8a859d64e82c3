/**
 * Command batching: every dispatch is recorded into one open compute pass of
 * one command encoder, and the whole batch is submitted at `flush()`. Nothing
 * here waits for the GPU except `read()`, the single sync point of the toolkit.
 *
 * Per-dispatch sizes live in a uniform arena: each dispatch gets its own
 * aligned slice, written with one `queue.writeBuffer` just before the submit.
 * Queue operations run in order, so the arena can be reused by the next batch.
 */
import type { CompiledKernel } from "./kernel.ts";

const ARENA_BYTES = 256 * 1024;

/** Counters for debugging and benchmarks. */
export interface BatchCounters {
  /** Compute dispatches recorded since the device was created. */
  dispatches: number;
  /** Queue submissions since the device was created. */
  submits: number;
  /** Blocking reads (GPU syncs) since the device was created. */
  reads: number;
}

/** Records dispatches and submits them in batches. */
export class CommandBatch {
  /** Dispatch, submit and read counts (for debugging and benchmarks). */
  readonly counters: BatchCounters = { dispatches: 0, submits: 0, reads: 0 };
  #device: GPUDevice;
  #align: number;
  #arena: GPUBuffer;
  #arenaData = new Uint32Array(ARENA_BYTES / 4);
  #arenaCursor = 0;
  #encoder: GPUCommandEncoder | null = null;
  #pass: GPUComputePassEncoder | null = null;
  #pending = 0;

  /** A batch recording onto `device`'s queue. */
  constructor(device: GPUDevice) {
    this.#device = device;
    this.#align = Math.max(device.limits.minUniformBufferOffsetAlignment, 16);
    this.#arena = device.createBuffer({
      label: "halfstep uniform arena",
      size: ARENA_BYTES,
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    });
  }

  /** True when commands are recorded but not yet submitted. */
  get hasPending(): boolean {
    return this.#pending > 0;
  }

  /**
   * Records one dispatch of `kernel`: `buffers` are bound at bindings 0..n-1
   * in order and, when the kernel has uniforms, `words` (u32) at binding n;
   * `workgroups` is the dispatch grid.
   */
  dispatch(
    kernel: CompiledKernel,
    buffers: readonly GPUBuffer[],
    words: readonly number[],
    workgroups: readonly [number, number?, number?],
  ): void {
    const entries: GPUBindGroupEntry[] = buffers.map((buffer, binding) => ({
      binding,
      resource: { buffer },
    }));
    if (kernel.uniforms.length > 0) {
      const bytes = words.length * 4;
      let offset = Math.ceil(this.#arenaCursor / this.#align) * this.#align;
      if (offset + bytes > ARENA_BYTES) {
        this.flush();
        offset = 0;
      }
      this.#arenaData.set(words, offset / 4);
      this.#arenaCursor = offset + bytes;
      entries.push({
        binding: buffers.length,
        resource: { buffer: this.#arena, offset, size: bytes },
      });
    }
    const bindGroup = this.#device.createBindGroup({ layout: kernel.layout, entries });
    const pass = this.#openPass();
    pass.setPipeline(kernel.pipeline);
    pass.setBindGroup(0, bindGroup);
    pass.dispatchWorkgroups(workgroups[0], workgroups[1] ?? 1, workgroups[2] ?? 1);
    this.#pending++;
    this.counters.dispatches++;
  }

  /** Records a buffer-to-buffer copy in stream order. */
  copy(source: GPUBuffer, target: GPUBuffer, bytes: number): void {
    this.#closePass();
    this.#openEncoder().copyBufferToBuffer(source, 0, target, 0, bytes);
    this.#pending++;
  }

  /**
   * Writes CPU data into `buffer` in stream order: anything recorded before
   * (which may still read the buffer's old contents) is submitted first.
   */
  write(buffer: GPUBuffer, data: ArrayBufferView<ArrayBuffer>): void {
    if (this.#pending > 0) this.flush();
    this.#device.queue.writeBuffer(buffer, 0, data.buffer, data.byteOffset, data.byteLength);
  }

  /** Submits everything recorded so far. Does not wait for the GPU. */
  flush(): void {
    if (this.#encoder === null) return;
    this.#closePass();
    if (this.#arenaCursor > 0) {
      this.#device.queue.writeBuffer(this.#arena, 0, this.#arenaData.buffer, 0, this.#arenaCursor);
    }
    this.#device.queue.submit([this.#encoder.finish()]);
    this.#encoder = null;
    this.#arenaCursor = 0;
    this.#pending = 0;
    this.counters.submits++;
  }

  /**
   * Copies `bytes` bytes of `buffer` back to the CPU. This is a sync point:
   * it submits the batch and waits until the GPU has finished it.
   */
  async read(buffer: GPUBuffer, bytes: number): Promise<ArrayBuffer> {
    const size = Math.ceil(bytes / 4) * 4;
    const staging = this.#device.createBuffer({
      label: "halfstep readback",
      size: Math.max(size, 4),
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    try {
      this.copy(buffer, staging, size);
      this.flush();
      this.counters.reads++;
      await staging.mapAsync(GPUMapMode.READ);
      return staging.getMappedRange().slice(0, bytes);
    } finally {
      staging.destroy();
    }
  }

  /** Frees the arena (device teardown). */
  destroy(): void {
    this.#arena.destroy();
  }

  #openEncoder(): GPUCommandEncoder {
    return this.#encoder ??= this.#device.createCommandEncoder({ label: "halfstep batch" });
  }

  #openPass(): GPUComputePassEncoder {
    return this.#pass ??= this.#openEncoder().beginComputePass();
  }

  #closePass(): void {
    this.#pass?.end();
    this.#pass = null;
  }
}
