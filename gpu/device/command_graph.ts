/**
 * A recorded step made replayable (CUDA Graphs' `cudaGraphExec`, ONNX
 * Runtime WebGPU's graph capture): the same pipelines, bind groups, dynamic
 * offsets and grids as the recording, in the same order, made once. A
 * replay ({@link CommandBatch.replay}) costs a pass of `setPipeline`,
 * `setBindGroup`, `dispatchWorkgroups` per dispatch and one `writeBuffer`:
 * no autograd, no tensors, no pool traffic.
 *
 * - **Uniforms.** The graph owns its uniform buffer: every dispatch's words
 *   at its own aligned slot, written once when the graph is made. The
 *   dispatches whose fields change per step (`LiveUniforms`: a scheduled
 *   learning rate, a dropout range) take the first slots, so a replay
 *   recomputes their fields and rewrites that one region with one
 *   `writeBuffer`.
 * - **Host writes** inside the step (a constant made with `Tensor.full`)
 *   become copies from one constant buffer holding their bytes, in stream
 *   order, as the writes were.
 * - **Bind groups** bind the graph's uniform buffer instead of the batch's
 *   arena; dispatches over the same buffers and layout share one.
 */
import { type CompiledKernel, type LiveUniforms, type UniformType, uniformWord } from "./kernel.ts";
import type { RecordedCommand } from "./command_recording.ts";
import { type DispatchCost, dispatchWork } from "./profiler.ts";

/** Bytes every uniform binding spans (as the command batch's arena binds them). */
export const UNIFORM_BINDING_BYTES = 256;

/**
 * The entries of a bind group of `kernel`'s layout: `buffers` at bindings
 * 0..n-1 and, when the kernel has uniforms, `uniforms` (256 bytes bound with
 * a dynamic offset) at binding n. The command batch's groups bind its arena,
 * a graph's bind its own uniform buffer.
 */
export function bindGroupEntries(
  kernel: CompiledKernel,
  buffers: readonly GPUBuffer[],
  uniforms: GPUBuffer,
): GPUBindGroupEntry[] {
  const entries: GPUBindGroupEntry[] = buffers.map((buffer, binding) => ({
    binding,
    resource: { buffer },
  }));
  if (kernel.uniforms.length > 0) {
    entries.push({
      binding: buffers.length,
      resource: { buffer: uniforms, offset: 0, size: UNIFORM_BINDING_BYTES },
    });
  }
  return entries;
}

/** A dispatch of a graph, ready to encode. */
export interface GraphDispatch {
  /** What it is. */
  readonly kind: "dispatch";
  /** Its kernel (the profiler names it; a failed submit blames it). */
  readonly kernel: CompiledKernel;
  /** The kernel's pipeline. */
  readonly pipeline: GPUComputePipeline;
  /** Its bind group 0. */
  readonly group: GPUBindGroup;
  /** The dynamic offset of its uniform slot (one element), or null when it binds none. */
  readonly offsets: number[] | null;
  /** The grid. */
  readonly x: number;
  /** The grid's second extent. */
  readonly y: number;
  /** The grid's third extent. */
  readonly z: number;
  /** What the launch said it costs. */
  readonly cost: DispatchCost;
}

/** A copy of a graph (a recorded copy, or a host write now copied from the constants). */
export interface GraphCopy {
  /** What it is. */
  readonly kind: "copy";
  /** Copied from. */
  readonly source: GPUBuffer;
  /** From this byte of the source. */
  readonly sourceOffset: number;
  /** Copied into, from byte 0. */
  readonly target: GPUBuffer;
  /** Bytes. */
  readonly bytes: number;
}

/** A graph's command. */
export type GraphCommand = GraphDispatch | GraphCopy;

/** The words a live dispatch recomputes: where they go and how they are packed. */
interface LiveSlot {
  readonly fn: LiveUniforms;
  readonly kernel: string;
  /** Word index in the uniform data of the dispatch's first word. */
  readonly base: number;
  readonly fields: readonly { index: number; name: string; type: UniformType }[];
}

/** A recorded step, replayable: see the module comment. */
export class CommandGraph {
  /** The commands in order. */
  readonly commands: readonly GraphCommand[];
  /** The distinct kernels it dispatches. */
  readonly kernels: readonly CompiledKernel[];
  /** How many commands are dispatches. */
  readonly dispatches: number;
  /** How many are copies (host writes included). */
  readonly copies: number;
  /** Bytes of GPU memory the graph holds itself (its uniforms and constants). */
  readonly bytes: number;
  /** The work its dispatches reported, as the flush policy weighs it. */
  readonly work: number;
  #uniforms: GPUBuffer | null;
  #words: Uint32Array<ArrayBuffer>;
  /** Bytes at the start of the uniform buffer that a replay rewrites. */
  #liveBytes: number;
  #live: LiveSlot[];
  #constants: GPUBuffer | null;

  /**
   * Makes `recording` replayable on `device`: the uniform slots are `align`
   * bytes apart (`minUniformBufferOffsetAlignment`, at least 256).
   */
  constructor(
    device: GPUDevice,
    recording: readonly RecordedCommand[],
    options: { align: number; label: string },
  ) {
    const align = Math.max(options.align, UNIFORM_BINDING_BYTES);
    const dispatches = recording.filter((c) => c.kind === "dispatch");
    const withUniforms = dispatches.filter((d) => d.kernel.uniforms.length > 0);
    // Live dispatches first: a replay rewrites one contiguous region.
    const ordered = [
      ...withUniforms.filter((d) => d.live),
      ...withUniforms.filter((d) => !d.live),
    ];
    const slot = new Map(ordered.map((d, i) => [d, i]));
    const liveCount = withUniforms.filter((d) => d.live).length;
    this.#words = new Uint32Array(Math.max(1, ordered.length) * align / 4);
    this.#live = [];
    for (const d of ordered) {
      const base = slot.get(d)! * align / 4;
      this.#words.set(d.words, base);
      if (d.live) {
        this.#live.push({
          fn: d.live,
          kernel: d.kernel.key,
          base,
          fields: d.liveWords.map((index) => ({
            index,
            name: d.kernel.uniforms[index][0],
            type: d.kernel.uniforms[index][1],
          })),
        });
      }
    }
    this.#liveBytes = liveCount * align;
    this.#uniforms = ordered.length === 0 ? null : device.createBuffer({
      label: `${options.label} uniforms`,
      size: this.#words.byteLength,
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    });
    if (this.#uniforms) device.queue.writeBuffer(this.#uniforms, 0, this.#words.buffer);

    // Host writes: their bytes side by side in one buffer, copied in stream order.
    const writes = recording.filter((c) => c.kind === "write");
    const constantBytes = writes.reduce((n, w) => n + Math.ceil(w.data.byteLength / 4) * 4, 0);
    this.#constants = constantBytes === 0 ? null : device.createBuffer({
      label: `${options.label} constants`,
      size: constantBytes,
      usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
    });
    const constantOffsets = new Map<RecordedCommand, number>();
    let at = 0;
    for (const w of writes) {
      device.queue.writeBuffer(
        this.#constants!,
        at,
        w.data.buffer,
        w.data.byteOffset,
        w.data.byteLength,
      );
      constantOffsets.set(w, at);
      at += Math.ceil(w.data.byteLength / 4) * 4;
    }

    const groups = new Map<string, GPUBindGroup>();
    const ids = new Map<object, number>();
    const id = (o: object) => ids.get(o) ?? (ids.set(o, ids.size), ids.size - 1);
    const groupOf = (kernel: CompiledKernel, buffers: readonly GPUBuffer[]) => {
      let key = `${id(kernel.layout)}`;
      for (const b of buffers) key += `,${id(b)}`;
      let group = groups.get(key);
      if (!group) {
        const entries = bindGroupEntries(kernel, buffers, this.#uniforms!);
        group = device.createBindGroup({ label: options.label, layout: kernel.layout, entries });
        groups.set(key, group);
      }
      return group;
    };
    this.commands = recording.map((c): GraphCommand => {
      if (c.kind === "copy") {
        return {
          kind: "copy",
          source: c.source,
          sourceOffset: 0,
          target: c.target,
          bytes: c.bytes,
        };
      }
      if (c.kind === "write") {
        return {
          kind: "copy",
          source: this.#constants!,
          sourceOffset: constantOffsets.get(c)!,
          target: c.target,
          bytes: c.data.byteLength,
        };
      }
      const s = slot.get(c);
      return {
        kind: "dispatch",
        kernel: c.kernel,
        pipeline: c.kernel.pipeline,
        group: groupOf(c.kernel, c.buffers),
        offsets: s === undefined ? null : [s * align],
        x: c.workgroups[0],
        y: c.workgroups[1],
        z: c.workgroups[2],
        cost: c.cost,
      };
    });
    this.kernels = [...new Set(dispatches.map((d) => d.kernel))];
    this.dispatches = dispatches.length;
    this.work = dispatches.reduce((n, d) => n + dispatchWork(d.cost), 0);
    this.copies = this.commands.length - dispatches.length;
    this.bytes = this.#words.byteLength * (this.#uniforms ? 1 : 0) + constantBytes;
  }

  /**
   * Recomputes the live fields and writes them (one `writeBuffer`, in
   * queue order: after every earlier submit, before the next). A live
   * function that throws (a learning rate that is not a number) stops it
   * before anything is written.
   */
  writeLiveUniforms(queue: GPUQueue): void {
    if (this.#liveBytes === 0) return;
    const words = this.#words;
    let lastFn: LiveUniforms | null = null;
    let values: { readonly [name: string]: number | undefined } = {};
    for (const slot of this.#live) {
      // Dispatches of one group (an optimizer's) share a function: computed once.
      if (slot.fn !== lastFn) values = (lastFn = slot.fn)();
      for (const f of slot.fields) {
        words[slot.base + f.index] = uniformWord(slot.kernel, f.name, f.type, values[f.name]!);
      }
    }
    queue.writeBuffer(this.#uniforms!, 0, words.buffer, 0, this.#liveBytes);
  }

  /** Frees the graph's uniform and constant buffers; it cannot be replayed afterwards. */
  destroy(): void {
    this.#uniforms?.destroy();
    this.#constants?.destroy();
    this.#uniforms = this.#constants = null;
  }
}
