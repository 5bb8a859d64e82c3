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
  /**
   * Bytes of the free buffers held for captured steps (their intermediates
   * between replays): part of `reservedBytes`, not of `allocatedBytes`, and
   * never released by `releaseCached`.
   */
  capturedBytes: number;
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

/**
 * The buffers one captured step keeps for itself (see
 * {@link BufferPool.openReserve}): every buffer its recorded runs took from
 * the pool. Its free ones are handed out only to the step's own next
 * recording and never to anyone else, so a replay finds each intermediate
 * where the recording left it. Its free buffers count as `capturedBytes`,
 * not as allocated: a replay's intermediates live exactly as the
 * recording's did, so the peak is the recorded (eager) step's.
 *
 * NOTE: the reserve hands out the free buffer that joined it first (as the
 * pool hands out the one created first), so a recording that does what the
 * last one did takes the same buffers in the same roles, and buffers that
 * joined later (taken from the pool when the reserve had none free) come
 * last: two recordings of one step agree as soon as the reserve stops
 * growing, whatever the pool held.
 */
export class PoolReserve {
  /** Free buffers by size class, the one that joined last first. @internal */
  readonly free: Map<number, GPUBuffer[]> = new Map();
  /** Every buffer it owns, free or in use, with the order it joined in. */
  readonly joined: Map<GPUBuffer, number> = new Map();

  /** True when `buffer` is one of its own. */
  owns(buffer: GPUBuffer): boolean {
    return this.joined.has(buffer);
  }

  /** Bytes of every buffer it owns. */
  get bytes(): number {
    let n = 0;
    for (const b of this.joined.keys()) n += b.size;
    return n;
  }
}

/** Hands out GPU buffers by size class and keeps the statistics. */
export class BufferPool {
  /** Free buffers by size class, highest creation number first (so `pop()` gives the lowest). */
  #free = new Map<number, GPUBuffer[]>();
  #inUse = new Set<GPUBuffer>();
  #serial = new WeakMap<GPUBuffer, number>();
  #created = 0;
  #allocated = 0;
  #captured = 0;
  #peak = 0;
  #reserved = 0;
  #count = 0;
  #create: BufferFactory;
  #beforeDestroy: () => void;
  /** The reserve each reserved buffer belongs to. */
  #owners = new Map<GPUBuffer, PoolReserve>();
  /** What to tell when a pinned buffer is released. */
  #pins = new Map<GPUBuffer, Set<() => void>>();
  /**
   * While set, buffers are taken from this reserve first, and what is taken
   * from the pool joins it (a captured step records). @internal
   */
  activeReserve: PoolReserve | null = null;
  /**
   * The most bytes the pool may hold (`reservedBytes`, buffers in use and
   * cached alike); Infinity for no limit. See `initGpu({ memoryLimitBytes })`.
   */
  limitBytes: number = Infinity;

  /**
   * A pool that creates its buffers with `create`; `beforeDestroy` runs
   * before it destroys free buffers (the device then submits the commands
   * recorded so far, which may use them, and forgets bind groups over them).
   */
  constructor(create: BufferFactory, beforeDestroy: () => void = () => {}) {
    this.#create = create;
    this.#beforeDestroy = beforeDestroy;
  }

  /** A buffer of at least `bytes` bytes; `label` (made only for a new buffer) names it in errors. */
  acquire(bytes: number, label: () => string): GPUBuffer {
    const size = sizeClass(bytes);
    const reserve = this.activeReserve;
    let buffer = reserve?.free.get(size)?.pop();
    if (buffer !== undefined) this.#captured -= size;
    else {
      buffer = this.#free.get(size)?.pop() ?? this.#createNew(size, label());
      if (reserve) this.#join(reserve, buffer);
    }
    this.#allocated += size;
    if (this.#allocated > this.#peak) this.#peak = this.#allocated;
    this.#inUse.add(buffer);
    return buffer;
  }

  /**
   * Returns a buffer for reuse (a reserved one to its reserve). A pinned
   * buffer tells its pins first. Releasing a buffer twice is a bug and throws.
   */
  release(buffer: GPUBuffer): void {
    if (!this.#inUse.delete(buffer)) {
      throw new StateError("BufferPool.release: buffer is not in use (released twice?).");
    }
    if (this.#pins.size > 0) this.#tellPins(buffer);
    this.#allocated -= buffer.size;
    const owner = this.#owners.size > 0 ? this.#owners.get(buffer) : undefined;
    if (owner) {
      this.#captured += buffer.size; // held for its step
      return this.#insertFree(owner.free, buffer, owner.joined);
    }
    this.#insertFree(this.#free, buffer, this.#serial);
  }

  /** An empty reserve for a captured step; see {@link PoolReserve}. */
  openReserve(): PoolReserve {
    return new PoolReserve();
  }

  /**
   * Gives a reserve's buffers back to the pool: its free ones become the
   * pool's, the ones still in use stay with whoever uses them.
   */
  closeReserve(reserve: PoolReserve): void {
    if (this.activeReserve === reserve) this.activeReserve = null;
    for (const list of reserve.free.values()) {
      for (const b of list) {
        this.#captured -= b.size;
        this.#insertFree(this.#free, b, this.#serial);
      }
    }
    reserve.free.clear();
    for (const b of reserve.joined.keys()) this.#owners.delete(b);
    reserve.joined.clear();
  }

  /**
   * Hands `buffer`, free in `reserve`, to a new holder (a handle on an
   * intermediate a replayed step left there: its gradients mid-accumulation).
   */
  claim(reserve: PoolReserve, buffer: GPUBuffer): void {
    const list = reserve.free.get(buffer.size);
    const i = list?.indexOf(buffer) ?? -1;
    if (i < 0) throw new StateError("BufferPool.claim: the buffer is not free in the reserve.");
    list!.splice(i, 1);
    this.#captured -= buffer.size;
    this.#allocated += buffer.size;
    if (this.#allocated > this.#peak) this.#peak = this.#allocated;
    this.#inUse.add(buffer);
  }

  /**
   * Moves `buffer`, free in the pool, into `reserve` (a captured step used it
   * and freed it: nobody else may take it now).
   */
  adoptInto(reserve: PoolReserve, buffer: GPUBuffer): void {
    const list = this.#free.get(buffer.size);
    const i = list?.indexOf(buffer) ?? -1;
    if (i < 0) throw new StateError("BufferPool.adoptInto: the buffer is not free in the pool.");
    list!.splice(i, 1);
    this.#captured += buffer.size;
    this.#join(reserve, buffer);
    this.#insertFree(reserve.free, buffer, reserve.joined);
  }

  #join(reserve: PoolReserve, buffer: GPUBuffer): void {
    reserve.joined.set(buffer, reserve.joined.size);
    this.#owners.set(buffer, reserve);
  }

  /** True when `buffer` is handed out (in use), not free in the pool or a reserve. */
  inUse(buffer: GPUBuffer): boolean {
    return this.#inUse.has(buffer);
  }

  /** Calls `onRelease` (once) when `buffer` is next released; see {@link BufferPool.unpin}. */
  pin(buffer: GPUBuffer, onRelease: () => void): void {
    let pins = this.#pins.get(buffer);
    if (!pins) this.#pins.set(buffer, pins = new Set());
    pins.add(onRelease);
  }

  /** Takes back a {@link BufferPool.pin}. */
  unpin(buffer: GPUBuffer, onRelease: () => void): void {
    const pins = this.#pins.get(buffer);
    pins?.delete(onRelease);
    if (pins?.size === 0) this.#pins.delete(buffer);
  }

  #tellPins(buffer: GPUBuffer): void {
    const pins = this.#pins.get(buffer);
    if (!pins) return;
    this.#pins.delete(buffer);
    for (const tell of pins) tell();
  }

  /**
   * Puts `buffer` in a free list by size class, lowest `order` last (what
   * `pop()` gives): the pool's creation order, or a reserve's joining order.
   */
  #insertFree(
    free: Map<number, GPUBuffer[]>,
    buffer: GPUBuffer,
    order: { get(b: GPUBuffer): number | undefined },
  ): void {
    let list = free.get(buffer.size);
    if (!list) free.set(buffer.size, list = []);
    // NOTE: acquire hands out the free buffer created first, whatever order they
    // were released in, so a loop that runs the same ops gets the same buffers
    // in the same roles every step, and the command batch's cached bind groups hit.
    const serial = order.get(buffer)!;
    let i = list.length;
    while (i > 0 && order.get(list[i - 1])! < serial) i--;
    list.splice(i, 0, buffer);
  }

  /** Destroys every cached (unused) buffer, lowering `reservedBytes`. */
  releaseCached(): void {
    // NOTE: a tensor freed after its last use was recorded, not yet submitted, is free
    // here: destroying its buffer first would fail that submit.
    this.#beforeDestroy();
    for (const list of this.#free.values()) {
      for (const b of list) {
        this.#reserved -= b.size;
        this.#count--;
        b.destroy();
      }
    }
    this.#free.clear();
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
      capturedBytes: this.#captured,
      peakBytes: this.#peak,
      reservedBytes: this.#reserved,
      bufferCount: this.#count,
    };
  }

  /** Destroys every buffer, in use or not (device teardown). */
  destroyAll(): void {
    this.releaseCached();
    for (const b of this.#inUse) b.destroy();
    for (const b of this.#owners.keys()) b.destroy(); // reserved (destroying twice is harmless)
    this.#inUse.clear();
    this.#owners.clear();
    this.#pins.clear();
    this.#allocated =
      this.#reserved =
      this.#count =
      this.#captured =
        0;
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
