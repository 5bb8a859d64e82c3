/**
 * The dispatch profiler behind `gpu.profile(fn)`. While it is attached to the
 * command batch, every dispatch runs in a compute pass of its own whose
 * beginning and end write GPU timestamps (`timestamp-query`); at each flush
 * the timestamps are resolved into a buffer and copied to a staging buffer,
 * and `finish()` reads them all back at once. Adapters without
 * `timestamp-query` fall back to wall time per flush: the time from one
 * flush's submit to the GPU finishing it, split evenly over its dispatches.
 */
import { bytesPerElement, type DType } from "../base/dtype.ts";

/** What one dispatch cost, where known (the launch says; bytes default to the tensors bound). */
export interface DispatchCost {
  /** Floating-point operations (a matmul: 2·m·n·k). */
  flops?: number;
  /** Bytes read and written. */
  bytes?: number;
}

/**
 * How many FLOPs cost as much time as moving one byte, to add both into one
 * work estimate (a large GPU's FMA rate over its memory bandwidth).
 */
const FLOPS_PER_BYTE = 16;

/**
 * A dispatch's estimated work, as the command batch's flush policy weighs
 * it: bytes moved plus FLOPs / 16.
 */
export function dispatchWork(cost: DispatchCost): number {
  return (cost.bytes ?? 0) + (cost.flops ?? 0) / FLOPS_PER_BYTE;
}

/** One profiled dispatch. */
export interface DispatchRecord {
  /** The kernel's family name (e.g. `"matmul"`). */
  family: string;
  /** Its pipeline cache key: family and config. */
  key: string;
  /** GPU time in milliseconds. */
  ms: number;
  /** Floating-point operations, when known. */
  flops?: number;
  /** Bytes moved, when known. */
  bytes?: number;
}

/** How dispatches are timed: GPU timestamps, or wall time per flush. */
export type ProfileTiming = "timestamp" | "wall";

/** Timestamp pairs one query set holds (WebGPU allows 4096 queries per set). */
const PAIRS_PER_SET = 2048;

interface PendingFlush {
  records: Omit<DispatchRecord, "ms">[];
  /** Timestamp mode: where the pairs are resolved, and the staging buffer they are copied to. */
  resolved?: GPUBuffer;
  staging?: GPUBuffer;
  /** Wall mode: when the submit happened and when the GPU had finished it. */
  submitted?: number;
  done?: Promise<number>;
}

/** Bytes of the tensors among `buffers` (anything with a size and a dtype). */
export function boundBytes(buffers: Record<string, unknown>): number {
  let bytes = 0;
  for (const value of Object.values(buffers)) {
    const t = value as { size?: unknown; dtype?: unknown } | undefined;
    if (typeof t?.size === "number" && typeof t.dtype === "string") {
      bytes += t.size * bytesPerElement(t.dtype as DType);
    }
  }
  return bytes;
}

/** Collects per-dispatch timings between `attach` and `finish`. @internal */
export class DispatchProfiler {
  /** How this profiler times dispatches. */
  readonly timing: ProfileTiming;
  #device: GPUDevice;
  #querySet: GPUQuerySet | null;
  #current: Omit<DispatchRecord, "ms">[] = [];
  #flushes: PendingFlush[] = [];

  /** A profiler for `device`; `timing` must be "wall" unless the device has timestamp-query. */
  constructor(device: GPUDevice, timing: ProfileTiming) {
    this.#device = device;
    this.timing = timing;
    this.#querySet = timing === "timestamp"
      ? device.createQuerySet({
        label: "halfstep profiler",
        type: "timestamp",
        count: 2 * PAIRS_PER_SET,
      })
      : null;
  }

  /** True when the next dispatch needs a flush first (the query set is full). */
  get full(): boolean {
    return this.#current.length >= PAIRS_PER_SET;
  }

  /** Notes one dispatch and returns the descriptor of the compute pass it runs in. */
  passFor(record: Omit<DispatchRecord, "ms">): GPUComputePassDescriptor {
    const i = this.#current.length;
    this.#current.push(record);
    if (!this.#querySet) return {};
    return {
      timestampWrites: {
        querySet: this.#querySet,
        beginningOfPassWriteIndex: 2 * i,
        endOfPassWriteIndex: 2 * i + 1,
      },
    };
  }

  /** Before a submit: resolve this flush's timestamps into a staging buffer (timestamp mode). */
  beforeSubmit(encoder: GPUCommandEncoder): void {
    const flush: PendingFlush = { records: this.#current };
    this.#current = [];
    if (this.#querySet && flush.records.length > 0) {
      const bytes = 16 * flush.records.length;
      const resolved = flush.resolved = this.#device.createBuffer({
        label: "halfstep profiler resolve",
        size: bytes,
        usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
      });
      flush.staging = this.#device.createBuffer({
        label: "halfstep profiler staging",
        size: bytes,
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      });
      encoder.resolveQuerySet(this.#querySet, 0, 2 * flush.records.length, resolved, 0);
      encoder.copyBufferToBuffer(resolved, 0, flush.staging, 0, bytes);
    }
    this.#flushes.push(flush);
  }

  /** After a submit: in wall mode, note when it left and ask when the GPU is done with it. */
  afterSubmit(queue: GPUQueue): void {
    const flush = this.#flushes.at(-1);
    if (!flush || this.#querySet || flush.records.length === 0) return;
    flush.submitted = performance.now();
    flush.done = queue.onSubmittedWorkDone().then(() => performance.now());
  }

  /** Every profiled dispatch with its GPU time. Call after the last flush; waits for the GPU. */
  async finish(): Promise<DispatchRecord[]> {
    const out: DispatchRecord[] = [];
    let previousDone = 0;
    for (const flush of this.#flushes) {
      if (flush.staging) {
        await flush.staging.mapAsync(GPUMapMode.READ);
        const stamps = new BigUint64Array(flush.staging.getMappedRange());
        flush.records.forEach((r, i) => {
          // Timestamps are nanoseconds; an adapter may report end < begin for an empty pass.
          const ns = stamps[2 * i + 1] > stamps[2 * i] ? stamps[2 * i + 1] - stamps[2 * i] : 0n;
          out.push({ ...r, ms: Number(ns) / 1e6 });
        });
        flush.staging.unmap();
        flush.staging.destroy();
        flush.resolved?.destroy();
      } else if (flush.done) {
        const done = await flush.done;
        const ms = done - Math.max(flush.submitted!, previousDone);
        previousDone = done;
        for (const r of flush.records) out.push({ ...r, ms: ms / flush.records.length });
      }
    }
    this.#querySet?.destroy();
    return out;
  }
}
