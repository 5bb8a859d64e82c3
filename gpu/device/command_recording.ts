/**
 * A recording of the commands one captured step issues: while a
 * {@link CommandRecording} is attached to the command batch
 * (`batch.recorder`), every dispatch, copy and host write the batch records
 * is also noted here, in order, with what it binds, the uniform words it
 * packed and its grid (the work still runs: a step is recorded while it runs
 * eagerly). A read is noted as a refusal: a captured step cannot read.
 *
 * Two recordings of the same step are compared ({@link firstDifference}) to
 * tell a step that does the same work every time (replayable) from one that
 * branches on host state; the fields its dispatches recompute at each replay
 * (`LiveUniforms`) are left out of the comparison. A recording becomes
 * replayable as a `CommandGraph` (command_graph.ts).
 */
import type { CompiledKernel, LiveUniforms } from "./kernel.ts";
import type { DispatchCost } from "./profiler.ts";

/** One dispatch as recorded. */
export interface RecordedDispatch {
  /** What it is. */
  readonly kind: "dispatch";
  /** The compiled kernel (its pipeline and bind-group layout). */
  readonly kernel: CompiledKernel;
  /** The storage buffers, in binding order. */
  readonly buffers: readonly GPUBuffer[];
  /** The uniform words as packed when it ran. */
  readonly words: readonly number[];
  /** The grid. */
  readonly workgroups: readonly [number, number, number];
  /** What the launch said it costs (the profiler's columns). */
  readonly cost: DispatchCost;
  /** The fields recomputed at each replay, or null. */
  readonly live: LiveUniforms | null;
  /** Indices into {@link RecordedDispatch.words} of the fields `live` gives. */
  readonly liveWords: readonly number[];
}

/** One buffer-to-buffer copy as recorded. */
export interface RecordedCopy {
  /** What it is. */
  readonly kind: "copy";
  /** Copied from. */
  readonly source: GPUBuffer;
  /** Copied into (from byte 0). */
  readonly target: GPUBuffer;
  /** Bytes, a multiple of 4. */
  readonly bytes: number;
}

/** One write of host data into a buffer (a tensor made inside the step) as recorded. */
export interface RecordedWrite {
  /** What it is. */
  readonly kind: "write";
  /** Written into (from byte 0). */
  readonly target: GPUBuffer;
  /** The bytes (a copy), a multiple of 4. */
  readonly data: Uint8Array<ArrayBuffer>;
}

/** A recorded command. */
export type RecordedCommand = RecordedDispatch | RecordedCopy | RecordedWrite;

/** The commands of one recorded step, in order, and what refuses it. */
export class CommandRecording {
  /** Everything the batch recorded, in order. */
  readonly commands: RecordedCommand[] = [];
  /** Why the step cannot be replayed (a read inside it), or null. */
  refusal: string | null = null;

  /** Notes a dispatch (the batch calls this as it records one). */
  dispatch(
    kernel: CompiledKernel,
    buffers: readonly GPUBuffer[],
    words: readonly number[],
    workgroups: readonly [number, number?, number?],
    cost: DispatchCost,
    live: LiveUniforms | null,
  ): void {
    let liveWords: number[] = [];
    if (live) {
      const given = live();
      liveWords = kernel.uniforms.flatMap(([name], i) => given[name] === undefined ? [] : [i]);
    }
    this.commands.push({
      kind: "dispatch",
      kernel,
      buffers,
      words,
      workgroups: [workgroups[0], workgroups[1] ?? 1, workgroups[2] ?? 1],
      cost,
      live,
      liveWords,
    });
  }

  /** Notes a buffer-to-buffer copy. */
  copy(source: GPUBuffer, target: GPUBuffer, bytes: number): void {
    this.commands.push({ kind: "copy", source, target, bytes });
  }

  /** Notes a write of host bytes (copied: the caller may reuse its array). */
  write(target: GPUBuffer, data: ArrayBufferView<ArrayBuffer>): void {
    const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength).slice();
    this.commands.push({ kind: "write", target, data: bytes });
  }

  /** Notes a read: the step waits for the GPU, so it cannot be replayed. */
  read(): void {
    this.refusal ??= "it reads the GPU (read(), item(), readBuffer: a sync point)";
  }

  /** Every buffer a command uses, once each. */
  buffers(): Set<GPUBuffer> {
    const out = new Set<GPUBuffer>();
    for (const c of this.commands) {
      if (c.kind === "dispatch") { for (const b of c.buffers) out.add(b); }
      else if (c.kind === "copy") out.add(c.source).add(c.target);
      else out.add(c.target);
    }
    return out;
  }
}

/** `kernel{config}` of a dispatch, or what another command is, for messages. */
export function describeCommand(c: RecordedCommand): string {
  if (c.kind === "dispatch") return c.kernel.key.slice(0, 120);
  if (c.kind === "copy") return `a copy of ${c.bytes} bytes`;
  return `a write of ${c.data.byteLength} bytes from the host`;
}

/**
 * Where recording `b` first differs from recording `a` (same step, two
 * runs), in words; null when they agree command for command: the same
 * kernels over the same buffers with the same grids and uniform words
 * (those a dispatch recomputes at each replay aside), the same copies and
 * the same written bytes.
 */
export function firstDifference(
  a: readonly RecordedCommand[],
  b: readonly RecordedCommand[],
): string | null {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const why = commandDifference(a[i], b[i]);
    if (why) return `command ${i} (${describeCommand(a[i])}): ${why}`;
  }
  if (a.length === b.length) return null;
  return `${a.length} commands, then ${b.length}`;
}

function commandDifference(x: RecordedCommand, y: RecordedCommand): string | null {
  if (x.kind !== y.kind) return `then ${describeCommand(y)}`;
  if (x.kind === "dispatch" && y.kind === "dispatch") {
    if (x.kernel !== y.kernel) return `then ${describeCommand(y)}`;
    if (!sameList(x.buffers, y.buffers)) {
      const i = x.buffers.findIndex((b, j) => b !== y.buffers[j]);
      return `binding ${i} (${x.kernel.bindings[i]?.name ?? "?"}) on another buffer`;
    }
    if (!sameList(x.workgroups, y.workgroups)) return "another grid";
    const live = new Set(x.liveWords);
    for (let i = 0; i < x.words.length; i++) {
      if (!live.has(i) && x.words[i] !== y.words[i]) {
        return `uniform ${x.kernel.uniforms[i]?.[0]} changed`;
      }
    }
    return null;
  }
  if (x.kind === "copy" && y.kind === "copy") {
    return x.source === y.source && x.target === y.target && x.bytes === y.bytes
      ? null
      : "another copy";
  }
  if (x.kind === "write" && y.kind === "write") {
    if (x.target !== y.target) return "written into another buffer";
    return sameList(x.data, y.data) ? null : "other bytes written from the host";
  }
  return null;
}

function sameList<T>(a: ArrayLike<T>, b: ArrayLike<T>): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
