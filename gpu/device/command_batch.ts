/**
 * Command batching: dispatches are recorded into an open compute pass of one
 * command encoder and submitted together. Nothing here waits for the GPU
 * except `read()`, the single sync point of the toolkit.
 *
 * - **Keep the GPU busy.** The batch is submitted as soon as it holds enough
 *   work ({@link FlushPolicy}: a dispatch count or an estimate of the bytes
 *   and FLOPs recorded), so the GPU runs the first part of a training step
 *   while JavaScript records the rest; reads still are the only waits.
 * - **Little JavaScript per dispatch.** Uniform words go into an arena,
 *   written with one `queue.writeBuffer` per submit (queue operations run in
 *   order, so the next batch can reuse it); the uniform is bound with a
 *   dynamic offset, so a bind group depends only on the storage buffers and
 *   is cached: a training loop that sees the same shapes gets the same pooled
 *   buffers back and reuses its bind groups.
 * - **Profiling.** While a {@link DispatchProfiler} is attached, each dispatch
 *   runs in a pass of its own that writes GPU timestamps.
 * - **Capture.** While a {@link CommandRecording} is attached (`recorder`),
 *   every command is noted there as well as recorded (a captured step's
 *   first runs); {@link CommandBatch.replay} encodes a `CommandGraph` made
 *   from such a recording, with its own bind groups and uniforms.
 */
import type { CompiledKernel, LiveUniforms } from "./kernel.ts";
import { type DispatchCost, type DispatchProfiler, dispatchWork } from "./profiler.ts";
import type { CommandRecording } from "./command_recording.ts";
import { bindGroupEntries, type CommandGraph, UNIFORM_BINDING_BYTES } from "./command_graph.ts";

const ARENA_BYTES = 256 * 1024;
/** Bind groups kept for reuse; past it, all are forgotten and made again as they are used. */
const BIND_GROUP_CACHE_SIZE = 4096;

/**
 * A node of the bind-group cache, a trie by layout then buffer: the group
 * over the buffers on its path, and the longer paths (no key strings to
 * build at each dispatch).
 */
interface GroupNode {
  group: GPUBindGroup | null;
  next: Map<GPUBuffer, GroupNode> | null;
}

/** Counters for debugging and benchmarks. */
export interface BatchCounters {
  /** Compute dispatches recorded since the device was created. */
  dispatches: number;
  /** Queue submissions since the device was created. */
  submits: number;
  /** Blocking reads (GPU syncs) since the device was created. */
  reads: number;
  /** Dispatches whose bind group came from the cache. */
  bindGroupHits: number;
  /** Buffer-to-buffer copies recorded since the device was created. */
  copies: number;
}

/**
 * When to submit the open batch without being asked: once it holds this many
 * dispatches, or this much estimated work (bytes moved plus FLOPs / 16, as
 * the launches report them). Infinity for both: only reads submit.
 */
export interface FlushPolicy {
  /** Dispatches per submit (at most). */
  maxDispatches: number;
  /** Estimated work per submit: bytes + FLOPs / 16 of the recorded dispatches. */
  maxWork: number;
}

/** Records dispatches and submits them in batches. */
export class CommandBatch {
  /** Dispatch, submit, read and bind-group-cache counts (for debugging and benchmarks). */
  readonly counters: BatchCounters = {
    dispatches: 0,
    submits: 0,
    reads: 0,
    bindGroupHits: 0,
    copies: 0,
  };
  /** When the batch submits by itself. */
  flushPolicy: FlushPolicy;
  /** Set while `gpu.profile()` runs. @internal */
  profiler: DispatchProfiler | null = null;
  /** Set while a captured step records: every command is noted there too. @internal */
  recorder: CommandRecording | null = null;
  #device: GPUDevice;
  #align: number;
  #arena: GPUBuffer;
  #arenaData = new Uint32Array(ARENA_BYTES / 4);
  #arenaCursor = 0;
  #encoder: GPUCommandEncoder | null = null;
  #pass: GPUComputePassEncoder | null = null;
  #pending = 0;
  #pendingWork = 0;
  #bindGroups = new Map<GPUBindGroupLayout, GroupNode>();
  #bindGroupCount = 0;
  /** The pipeline the open pass has set (a pass keeps it). */
  #passPipeline: GPUComputePipeline | null = null;
  #offsets = [0];
  #kernels = new Set<CompiledKernel>();
  /** Graphs replayed into the open batch (a failed submit names their kernels too). */
  #graphs: CommandGraph[] = [];
  #onSubmitError: (message: string, kernels: CompiledKernel[]) => void;

  /**
   * A batch recording onto `device`'s queue. Every submit runs inside a
   * validation error scope; `onSubmitError` hears of a submit that failed and
   * the kernels it held (so a bad kernel breaks its batch, not the device).
   */
  constructor(
    device: GPUDevice,
    flushPolicy: FlushPolicy,
    onSubmitError: (message: string, kernels: CompiledKernel[]) => void = () => {},
  ) {
    this.#device = device;
    this.flushPolicy = flushPolicy;
    this.#onSubmitError = onSubmitError;
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
   * `workgroups` is the dispatch grid. `cost` feeds the flush policy and the
   * profiler; `live` (the fields a replay recomputes) goes to the recorder.
   */
  dispatch(
    kernel: CompiledKernel,
    buffers: readonly GPUBuffer[],
    words: readonly number[],
    workgroups: readonly [number, number?, number?],
    cost: DispatchCost = {},
    live: LiveUniforms | null = null,
  ): void {
    this.recorder?.dispatch(kernel, buffers, words, workgroups, cost, live);
    const bindGroup = this.#bindGroup(kernel, buffers);
    let offset = 0;
    if (kernel.uniforms.length > 0) {
      const bytes = words.length * 4;
      offset = Math.ceil(this.#arenaCursor / this.#align) * this.#align;
      if (offset + UNIFORM_BINDING_BYTES > ARENA_BYTES) {
        this.flush();
        offset = 0;
      }
      this.#arenaData.set(words, offset / 4);
      this.#arenaCursor = offset + bytes;
    }
    const profiler = this.profiler;
    if (profiler?.full) this.flush();
    if (profiler) this.#closePass();
    const pass = profiler
      ? this.#openEncoder().beginComputePass(profiler.passFor({
        family: kernel.key.slice(0, kernel.key.indexOf("{")),
        key: kernel.key,
        ...cost,
      }))
      : this.#openPass();
    if (profiler || kernel.pipeline !== this.#passPipeline) {
      pass.setPipeline(this.#passPipeline = kernel.pipeline);
    }
    if (kernel.uniforms.length > 0) {
      this.#offsets[0] = offset;
      pass.setBindGroup(0, bindGroup, this.#offsets);
    } else pass.setBindGroup(0, bindGroup);
    pass.dispatchWorkgroups(workgroups[0], workgroups[1] ?? 1, workgroups[2] ?? 1);
    if (profiler) {
      pass.end();
      this.#passPipeline = null;
    }
    this.#kernels.add(kernel);
    this.#pending++;
    this.counters.dispatches++;
    this.#pendingWork += dispatchWork(cost);
    this.flushIfDue();
  }

  /** Records a buffer-to-buffer copy in stream order. */
  copy(source: GPUBuffer, target: GPUBuffer, bytes: number): void {
    this.recorder?.copy(source, target, bytes);
    this.#closePass();
    this.#openEncoder().copyBufferToBuffer(source, 0, target, 0, bytes);
    this.#pending++;
    this.counters.copies++;
  }

  /**
   * Writes CPU data into `buffer` in stream order: anything recorded before
   * (which may still read the buffer's old contents) is submitted first.
   */
  write(buffer: GPUBuffer, data: ArrayBufferView<ArrayBuffer>): void {
    this.recorder?.write(buffer, data);
    if (this.#pending > 0) this.flush();
    // The bytes, never the view itself: Dawn (0.6.2) takes a view's element size from its
    // type and dies with SIGFPE on a Float16Array, which it does not know.
    this.#device.queue.writeBuffer(buffer, 0, data.buffer, data.byteOffset, data.byteLength);
  }

  /** Submits everything recorded so far. Does not wait for the GPU. */
  flush(): void {
    if (this.#encoder === null) return;
    this.#closePass();
    if (this.#arenaCursor > 0) {
      this.#device.queue.writeBuffer(this.#arena, 0, this.#arenaData.buffer, 0, this.#arenaCursor);
    }
    this.profiler?.beforeSubmit(this.#encoder);
    const kernels = [...this.#kernels, ...this.#graphs.flatMap((g) => g.kernels)];
    this.#kernels.clear();
    this.#graphs.length = 0;
    this.#device.pushErrorScope("validation");
    this.#device.queue.submit([this.#encoder.finish()]);
    this.#device.popErrorScope().then((error) => {
      if (error) this.#onSubmitError(error.message, kernels);
    });
    this.profiler?.afterSubmit(this.#device.queue);
    this.#encoder = null;
    this.#arenaCursor = 0;
    this.#pending = 0;
    this.#pendingWork = 0;
    this.counters.submits++;
  }

  /**
   * Copies `bytes` bytes of `buffer` back to the CPU. This is a sync point:
   * it submits the batch and waits until the GPU has finished it.
   */
  async read(buffer: GPUBuffer, bytes: number): Promise<ArrayBuffer> {
    this.recorder?.read();
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

  /**
   * Encodes `graph` (a captured step) into the batch: earlier work is
   * submitted first and the graph's live uniforms written, then `prelude`
   * runs (the step's inputs copied into its buffers), then the graph's
   * commands follow in one pass (a pass per dispatch while profiling). The
   * batch submits it as the flush policy says ({@link CommandBatch.flushIfDue}).
   */
  replay(graph: CommandGraph, prelude: () => void = () => {}): void {
    // Submitted first: an earlier replay of this graph must not see the words written now.
    this.flush();
    graph.writeLiveUniforms(this.#device.queue);
    prelude();
    const profiler = this.profiler;
    let pass: GPUComputePassEncoder | null = null;
    let pipeline: GPUComputePipeline | null = null; // a pass keeps it: set only when it changes
    for (const c of graph.commands) {
      if (c.kind === "copy") {
        this.#closePass();
        pass = pipeline = null;
        this.#openEncoder().copyBufferToBuffer(c.source, c.sourceOffset, c.target, 0, c.bytes);
        continue;
      }
      if (profiler) {
        if (profiler.full) this.flush();
        this.#closePass();
        const key = c.kernel.key;
        pass = this.#openEncoder().beginComputePass(
          profiler.passFor({ family: key.slice(0, key.indexOf("{")), key, ...c.cost }),
        );
      } else pass ??= this.#openPass();
      if (c.pipeline !== pipeline) pass.setPipeline(pipeline = c.pipeline);
      if (c.offsets) pass.setBindGroup(0, c.group, c.offsets);
      else pass.setBindGroup(0, c.group);
      pass.dispatchWorkgroups(c.x, c.y, c.z);
      if (profiler) {
        pass.end();
        pass = pipeline = null;
      }
    }
    this.#graphs.push(graph);
    this.#pending += graph.commands.length;
    this.#pendingWork += graph.work;
    this.counters.dispatches += graph.dispatches;
    this.counters.copies += graph.copies;
  }

  /** Submits what is recorded when the flush policy says it is enough (as a dispatch does). */
  flushIfDue(): void {
    const policy = this.flushPolicy;
    if (this.#pending >= policy.maxDispatches || this.#pendingWork >= policy.maxWork) this.flush();
  }

  /** Forgets every cached bind group (buffers were destroyed). */
  clearBindGroups(): void {
    this.#bindGroups.clear();
    this.#bindGroupCount = 0;
  }

  /** Frees the arena (device teardown). */
  destroy(): void {
    this.#bindGroups.clear();
    this.#arena.destroy();
  }

  /** The bind group of `kernel`'s layout over `buffers` (and the arena), cached. */
  #bindGroup(kernel: CompiledKernel, buffers: readonly GPUBuffer[]): GPUBindGroup {
    if (this.#bindGroupCount >= BIND_GROUP_CACHE_SIZE) this.clearBindGroups();
    let node: GroupNode | undefined = this.#bindGroups.get(kernel.layout);
    if (!node) this.#bindGroups.set(kernel.layout, node = { group: null, next: null });
    for (let i = 0; i < buffers.length; i++) {
      const next: Map<GPUBuffer, GroupNode> = node.next ??= new Map();
      let child = next.get(buffers[i]);
      if (!child) next.set(buffers[i], child = { group: null, next: null });
      node = child;
    }
    if (node.group) {
      this.counters.bindGroupHits++;
      return node.group;
    }
    this.#bindGroupCount++;
    const entries = bindGroupEntries(kernel, buffers, this.#arena);
    return node.group = this.#device.createBindGroup({ layout: kernel.layout, entries });
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
    this.#passPipeline = null;
  }
}
