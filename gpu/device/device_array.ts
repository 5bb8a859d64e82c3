/**
 * DeviceArray: a shape, a dtype and a GPU buffer from the pool — what kernels
 * take and return (as TensorFlow.js's backends take `TensorInfo`). The buffer
 * is reference-counted, so several arrays may view it (a reshape, the tape's
 * saved copy); it goes back to the pool when the last one is disposed.
 * `Tensor` (gpu/tensor/) is a DeviceArray the tape and tidy scopes know;
 * ops wrap a kernel's result in one with `Tensor.adopt`.
 */
import { bf16FromF32, f32FromBf16 } from "../base/bf16.ts";
import { assertDType, bytesPerElement, type DType } from "../base/dtype.ts";
import { DTypeError, fail, ShapeError, StateError } from "../base/errors.ts";
import { assertValidShape, sameShape, type Shape, shapeString, sizeOf } from "../base/shape.ts";
import { getGpu, type Gpu } from "./gpu.ts";

/** What {@link DeviceArray.read} returns: an `Int32Array` for i32, else a `Float32Array`. */
export type ArrayValues = Float32Array | Int32Array;

/** A reference-counted GPU buffer shared by the arrays that view it. @internal */
export class ArrayStorage {
  /** Arrays holding the buffer. */
  refs = 1;
  /** A buffer of `gpu`'s pool, held once. */
  constructor(readonly gpu: Gpu, readonly buffer: GPUBuffer) {}
  /** One more holder. */
  retain(): this {
    this.refs++;
    return this;
  }
  /** One holder fewer; the buffer goes back to the pool with the last. */
  release(): void {
    if (--this.refs === 0) this.gpu.pool.release(this.buffer);
  }
}

/** Bytes a buffer needs for `size` elements of `dtype` (copies move whole 4-byte words). */
export function bufferBytes(size: number, dtype: DType): number {
  return Math.max(4, Math.ceil((size * bytesPerElement(dtype)) / 4) * 4);
}

/**
 * Throws a clear GpuError from `op` when an array of this shape and dtype
 * cannot be one buffer of `gpu`; call it before allocating host memory for
 * one. `fix` (optional) replaces the message's advice.
 */
export function assertArrayFits(
  op: string,
  shape: Shape,
  dtype: DType,
  gpu: Gpu,
  fix?: string,
): void {
  const bytes = bufferBytes(sizeOf(shape), dtype);
  gpu.assertBufferFits(op, `${dtype} ${shapeString(shape)}`, bytes, fix);
}

/** `data` as little-endian bytes of `dtype` (f16 and bf16 rounded to nearest even on the CPU). */
export function hostBytes(data: ArrayLike<number>, dtype: DType): Uint8Array {
  const host = dtype === "f32"
    ? Float32Array.from(data)
    : dtype === "f16"
    ? Float16Array.from(data)
    : dtype === "bf16"
    ? bf16FromF32(data)
    : Int32Array.from(data);
  return new Uint8Array(host.buffer, 0, host.byteLength);
}

/**
 * Checks an allocation of `shape` × `dtype` on `gpu` for `op` (a valid dtype
 * and shape, one buffer's worth, f16 only where the device has it).
 */
export function checkAllocation(op: string, shape: Shape, dtype: DType, gpu: Gpu): void {
  assertDType(op, dtype);
  assertValidShape(op, shape);
  assertArrayFits(op, shape, dtype, gpu);
  if (dtype === "f16" && !gpu.f16) {
    fail(
      DTypeError,
      "Tensor",
      `cannot create an f16 tensor of shape ${shapeString(shape)}: f16 is off on this device ` +
        "(the adapter has no shader-f16, or initGpu({ f16: 'off' }) was used). Use f32.",
    );
  }
}

/** An n-dimensional array of f32, f16, bf16 or i32 values in a GPU buffer. */
export class DeviceArray {
  /** Extents, outermost first. */
  readonly shape: Shape;
  /** Element type. */
  readonly dtype: DType;
  /** The device holding the data. */
  readonly gpu: Gpu;
  #storage: ArrayStorage | null;

  /** Wraps `storage`, or a new buffer from the pool. Use {@link DeviceArray.empty}. @internal */
  constructor(gpu: Gpu, shape: Shape, dtype: DType, storage?: ArrayStorage) {
    this.gpu = gpu;
    this.shape = shape;
    this.dtype = dtype;
    this.#storage = storage ?? new ArrayStorage(
      gpu,
      gpu.pool.acquire(
        bufferBytes(sizeOf(shape), dtype),
        () => `${dtype} tensor ${shapeString(shape)}`,
      ),
    );
  }

  /**
   * An uninitialised array: its contents are whatever the pooled buffer held.
   * Kernels use it for outputs they overwrite completely.
   */
  static empty(shape: Shape, dtype: DType = "f32", gpu: Gpu = getGpu()): DeviceArray {
    checkAllocation("Tensor.empty", shape, dtype, gpu);
    return new DeviceArray(gpu, shape, dtype);
  }

  /** An array with every element `value` (uploaded from the host: scratch operands, zeros). */
  static filled(shape: Shape, value: number, dtype: DType, gpu: Gpu): DeviceArray {
    checkAllocation("Tensor.full", shape, dtype, gpu);
    const array = new DeviceArray(gpu, shape, dtype);
    array.writeBytes(hostBytes(new Float32Array(sizeOf(shape)).fill(value), dtype));
    return array;
  }

  /** Number of elements. */
  get size(): number {
    return sizeOf(this.shape);
  }

  /** Number of dimensions. */
  get rank(): number {
    return this.shape.length;
  }

  /** True once `dispose()` ran; the array can no longer be used. */
  get disposed(): boolean {
    return this.#storage === null;
  }

  /** The GPU buffer (may be larger than the data). Throws after dispose. */
  get buffer(): GPUBuffer {
    return this.live("use").buffer;
  }

  /** `f32 [2, 3]`, as errors print it. */
  describe(): string {
    return `${this.dtype} ${shapeString(this.shape)}`;
  }

  /**
   * Copies the values to the CPU: an `Int32Array` for i32 (exact over its
   * whole range, where f32 would round above 2²⁴), a `Float32Array` for f32,
   * f16 and bf16 (their exact values). **A sync point**: submits pending work
   * and waits for the GPU, so call it to log, not inside a training step.
   */
  async read(): Promise<ArrayValues> {
    const storage = this.live("read");
    storage.retain(); // stay valid even if disposed while we wait
    try {
      const bytes = this.size * bytesPerElement(this.dtype);
      const data = await this.gpu.readBuffer(storage.buffer, bytes);
      if (this.dtype === "i32") return new Int32Array(data);
      if (this.dtype === "bf16") return f32FromBf16(new Uint16Array(data));
      return this.dtype === "f32"
        ? new Float32Array(data)
        : new Float32Array(new Float16Array(data));
    } finally {
      storage.release();
    }
  }

  /**
   * Overwrites the contents with raw little-endian bytes in this array's
   * dtype (exactly size × bytes-per-element of them), in stream order.
   */
  writeBytes(bytes: Uint8Array): void {
    const expected = this.size * bytesPerElement(this.dtype);
    if (bytes.byteLength !== expected) {
      fail(
        ShapeError,
        "Tensor.writeBytes",
        `${bytes.byteLength} bytes given for ${this.describe()}, which holds ${expected}.`,
      );
    }
    const padded = new Uint8Array(bufferBytes(this.size, this.dtype));
    padded.set(bytes);
    this.gpu.batch.write(this.live("write").buffer, padded);
  }

  /** Overwrites the contents with those of `source` (same shape and dtype), on the GPU. */
  copyFrom(source: DeviceArray): void {
    if (source.dtype !== this.dtype || !sameShape(source.shape, this.shape)) {
      fail(
        source.dtype !== this.dtype ? DTypeError : ShapeError,
        "Tensor.copyFrom",
        `source ${source.describe()} does not match ${this.describe()}.`,
      );
    }
    this.gpu.batch.copy(
      source.buffer,
      this.live("write").buffer,
      bufferBytes(this.size, this.dtype),
    );
  }

  /**
   * A second handle to the same GPU memory, optionally with another shape of
   * the same size; the memory stays alive until every handle is disposed.
   */
  share(shape: Shape = this.shape): DeviceArray {
    return new DeviceArray(this.gpu, shape, this.dtype, this.sharedStorage(shape));
  }

  /** True when both handles view the same GPU memory (see {@link DeviceArray.share}). */
  sharesMemoryWith(other: DeviceArray): boolean {
    return this.#storage !== null && this.#storage === other.#storage;
  }

  /** Returns the buffer to the pool once no other handle views it. Idempotent. */
  dispose(): void {
    if (this.#storage === null) return;
    this.#storage.release();
    this.#storage = null;
  }

  /**
   * Hands this handle's hold on the buffer to a new owner (`Tensor.adopt`);
   * this array is disposed after, without releasing anything. @internal
   */
  takeStorage(): ArrayStorage {
    const storage = this.live("adopt");
    this.#storage = null;
    return storage;
  }

  /** The storage, held once more, for a handle of `shape` (checked to be the same size). */
  protected sharedStorage(shape: Shape): ArrayStorage {
    if (sizeOf(shape) !== this.size) {
      fail(ShapeError, "Tensor.share", `cannot view ${this.describe()} as ${shapeString(shape)}.`);
    }
    return this.live("share").retain();
  }

  /** The storage, or a clear error once disposed. */
  protected live(what: string): ArrayStorage {
    if (this.#storage === null) {
      fail(
        StateError,
        "Tensor",
        `cannot ${what} tensor ${this.describe()}: it was disposed. ` +
          "Keep it alive (return it from tidy() or call keep()) until you are done with it.",
      );
    }
    return this.#storage;
  }
}
