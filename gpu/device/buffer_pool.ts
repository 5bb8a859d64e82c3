/**
 * A size-class pool of GPU storage buffers with memory statistics.
 *
 * V8 cannot see GPU memory, so buffers are returned explicitly (`release`) and
 * reused by size class instead of being created per op. Classes are powers of
 * two up to 1 MiB, then multiples of 1 MiB, which bounds waste at 2x for small
 * buffers and to under 1 MiB for large ones.
 */
import { fail, GpuError, StateError } from "../base/errors.ts";

/** Memory figures a user can read at any time (no GPU sync). */
export interface MemoryStats {
  /** Bytes held by live buffers handed out by the pool right now. */
  allocatedBytes: number;
  /** Highest `allocatedBytes` since the pool was created or `resetPeak()` ran. */
  peakBytes: number;
  /** Bytes of every GPU buffer the pool owns, in use or cached for reuse. */
  reservedBytes: number;
  /** Number of GPU buffers the pool owns. */
  bufferCount: number;
}

const MIN_CLASS = 256;
const MIB = 1 << 20;

/** The size class a request of `bytes` is served from. */
export function sizeClass(bytes: number): number {
  if (bytes <= MIN_CLASS) return MIN_CLASS;
  if (bytes <= MIB) return 2 ** Math.ceil(Math.log2(bytes));
  return Math.ceil(bytes / MIB) * MIB;
}

/** Usage every pooled buffer has: read/written by kernels, copied in and out. */
export const POOL_USAGE = 0x0080 /* STORAGE */ | 0x0004 /* COPY_SRC */ | 0x0008; /* COPY_DST */

/** Creates buffers for the pool; the device layer adds limit checks and error scopes. */
export type BufferFactory = (bytes: number, label: string) => GPUBuffer;

/** Hands out GPU buffers by size class and keeps the statistics. */
export class BufferPool {
  /** Free buffers by size class, highest creation number first (so `pop()` gives the lowest). */
  #free = new Map<number, GPUBuffer[]>();
  #inUse = new Set<GPUBuffer>();
  #serial = new WeakMap<GPUBuffer, number>();
  #created = 0;
  #allocated = 0;
  #peak = 0;
  #reserved = 0;
  #count = 0;
  #create: BufferFactory;
  #onDestroy: () => void;
  /**
   * The most bytes the pool may hold (`reservedBytes`, buffers in use and
   * cached alike); Infinity for no limit. See `initGpu({ memoryLimitBytes })`.
   */
  limitBytes: number = Infinity;

  /**
   * A pool that creates its buffers with `create`; `onDestroy` runs after it
   * destroys buffers (the command batch then forgets bind groups over them).
   */
  constructor(create: BufferFactory, onDestroy: () => void = () => {}) {
    this.#create = create;
    this.#onDestroy = onDestroy;
  }

  /** A buffer of at least `bytes` bytes; `label` names it in errors. */
  acquire(bytes: number, label: string): GPUBuffer {
    const size = sizeClass(bytes);
    const buffer = this.#free.get(size)?.pop() ?? this.#createNew(size, label);
    this.#inUse.add(buffer);
    this.#allocated += size;
    if (this.#allocated > this.#peak) this.#peak = this.#allocated;
    return buffer;
  }

  /** Returns a buffer for reuse. Releasing a buffer twice is a bug and throws. */
  release(buffer: GPUBuffer): void {
    if (!this.#inUse.delete(buffer)) {
      throw new StateError("BufferPool.release: buffer is not in use (released twice?).");
    }
    this.#allocated -= buffer.size;
    let list = this.#free.get(buffer.size);
    if (!list) this.#free.set(buffer.size, list = []);
    // NOTE: acquire hands out the free buffer created first, whatever order they
    // were released in, so a loop that runs the same ops gets the same buffers
    // in the same roles every step, and the command batch's cached bind groups hit.
    const serial = this.#serial.get(buffer)!;
    let i = list.length;
    while (i > 0 && this.#serial.get(list[i - 1])! < serial) i--;
    list.splice(i, 0, buffer);
  }

  /** Destroys every cached (unused) buffer, lowering `reservedBytes`. */
  releaseCached(): void {
    for (const list of this.#free.values()) {
      for (const b of list) {
        this.#reserved -= b.size;
        this.#count--;
        b.destroy();
      }
    }
    this.#free.clear();
    this.#onDestroy();
  }

  /** Starts a new peak measurement from the current allocation. */
  resetPeak(): void {
    this.#peak = this.#allocated;
  }

  /**
   * Puts back a peak read before the library's own scratch work (lazy
   * tuning at a wait), so the caller's figures do not show it: the peak
   * becomes `peakBytes`, or the current allocation if higher.
   */
  restorePeak(peakBytes: number): void {
    this.#peak = Math.max(peakBytes, this.#allocated);
  }

  /** The current figures. */
  stats(): MemoryStats {
    return {
      allocatedBytes: this.#allocated,
      peakBytes: this.#peak,
      reservedBytes: this.#reserved,
      bufferCount: this.#count,
    };
  }

  /** Destroys every buffer, in use or not (device teardown). */
  destroyAll(): void {
    this.releaseCached();
    for (const b of this.#inUse) b.destroy();
    this.#inUse.clear();
    this.#allocated = this.#reserved = this.#count = 0;
  }

  #createNew(size: number, label: string): GPUBuffer {
    if (this.#reserved + size > this.limitBytes) {
      this.releaseCached(); // cached buffers go first
      if (this.#reserved + size > this.limitBytes) {
        fail(
          GpuError,
          "memory",
          `allocating ${label} (${size} bytes) would take GPU memory to ${
            this.#reserved + size
          } bytes, over the limit of ${this.limitBytes} (${this.#allocated} bytes in use now). ` +
            "Lower the batch size, use AMP or gradient checkpointing, free tensors you no " +
            "longer need (tidy, dispose), or raise initGpu({ memoryLimitBytes }).",
        );
      }
    }
    const buffer = this.#create(size, label);
    this.#serial.set(buffer, this.#created++);
    this.#reserved += size;
    this.#count++;
    return buffer;
  }
}
