/**
 * Tensor: a shape, a dtype and a GPU buffer from the pool. Reading values back
 * (`read`, `item`) is the only thing that waits for the GPU.
 */
import { bf16FromF32, f32FromBf16 } from "../base/bf16.ts";
import { assertDType, bytesPerElement, type DType } from "../base/dtype.ts";
import { getGpu, type Gpu } from "../device/gpu.ts";
import { DTypeError, fail, ShapeError, StateError, ValueError } from "../base/errors.ts";
import { assertValidShape, sameShape, type Shape, shapeString, sizeOf } from "../base/shape.ts";
import { track } from "./scope.ts";
import { shortValue } from "../base/short_text.ts";
import type { OpName } from "../base/op_registry.ts";

/**
 * What a tensor knows of the tape node that produced it: the tape
 * (autograd.ts) loads Tensor and implements this; Tensor never loads the
 * tape, and reaches the backward pass through its node.
 */
export interface GradNode {
  /** The op's registry name. */
  readonly op: OpName;
  /** The op's inputs, in the order the rule returns their gradients. */
  readonly inputs: readonly Tensor[];
  /** The output this node produced. */
  readonly output: Tensor;
  /** Backpropagates from `output` (what {@link Tensor.backward} calls). */
  backpropagate(output: Tensor, options: BackwardOptions): void;
  /** One more holder (a consumer node). @internal */
  hold(): void;
  /** One holder fewer; at none, the saved activations are freed. @internal */
  drop(): void;
}

/** Options of {@link Tensor.backward}. */
export interface BackwardOptions {
  /** The gradient of the output (same shape and dtype); required unless it holds one value. */
  gradient?: Tensor;
}

/** Host data a tensor can be made from: Float32Array, Float16Array, Float64Array, number[]... */
export type TensorData = ArrayLike<number>;

/** What {@link Tensor.read} returns: an `Int32Array` for an i32 tensor, else a `Float32Array`. */
export type TensorValues = Float32Array | Int32Array;

/** Options for creating a tensor. */
export interface TensorOptions {
  /** Element type on the GPU (default `"f32"`). */
  dtype?: DType;
  /** Whether autograd should compute a gradient for this tensor (default false). */
  requiresGrad?: boolean;
  /** The device (default: the one `initGpu()` made). */
  gpu?: Gpu;
}

/** A reference-counted GPU buffer shared by a tensor and the tape's saved copies of it. */
class Storage {
  refs = 1;
  constructor(readonly gpu: Gpu, readonly buffer: GPUBuffer) {}
  retain(): this {
    this.refs++;
    return this;
  }
  release(): void {
    if (--this.refs === 0) this.gpu.pool.release(this.buffer);
  }
}

/** Bytes a buffer needs for `size` elements of `dtype` (copies move whole 4-byte words). */
export function bufferBytes(size: number, dtype: DType): number {
  return Math.max(4, Math.ceil((size * bytesPerElement(dtype)) / 4) * 4);
}

/**
 * Throws a clear GpuError from `op` when a tensor of this shape and dtype
 * cannot be one buffer of `gpu`; call it before allocating host memory for
 * one. `fix` (optional) replaces the message's advice.
 */
export function assertTensorFits(
  op: string,
  shape: Shape,
  dtype: DType,
  gpu: Gpu,
  fix?: string,
): void {
  const bytes = bufferBytes(sizeOf(shape), dtype);
  gpu.assertBufferFits(op, `${dtype} ${shapeString(shape)}`, bytes, fix);
}

/**
 * Smallest and largest value of an index tensor, and the values next to them,
 * so an op that allows one special id (cross-entropy's ignore index) can still
 * check all the others.
 */
export interface IndexRange {
  /** Smallest value. */
  min: number;
  /** Largest value. */
  max: number;
  /** Smallest value above `min` (Infinity when every value equals `min`). */
  aboveMin: number;
  /** Largest value below `max` (−Infinity when every value equals `max`). */
  belowMax: number;
}

function checkIndices(data: TensorData, shape: Shape): void {
  for (let i = 0; i < data.length; i++) {
    const v = data[i];
    if (!Number.isInteger(v) || v < -(2 ** 31) || v >= 2 ** 31) {
      fail(
        ValueError,
        "Tensor.from",
        `element ${i} (${v}) of an i32 tensor ${shapeString(shape)} is not a 32-bit integer.`,
      );
    }
  }
}

function indexRange(data: TensorData): IndexRange {
  let min = Infinity, max = -Infinity, aboveMin = Infinity, belowMax = -Infinity;
  for (let i = 0; i < data.length; i++) {
    const v = data[i];
    if (v < min) [aboveMin, min] = [min, v];
    else if (v > min && v < aboveMin) aboveMin = v;
    if (v > max) [belowMax, max] = [max, v];
    else if (v < max && v > belowMax) belowMax = v;
  }
  return { min, max, aboveMin, belowMax };
}

/** An n-dimensional array of f32, f16, bf16 or i32 values on the GPU. */
export class Tensor {
  /** Extents, outermost first. */
  readonly shape: Shape;
  /** Element type. */
  readonly dtype: DType;
  /** The device holding the data. */
  readonly gpu: Gpu;
  /** Whether autograd tracks this tensor. */
  requiresGrad: boolean;
  /** Accumulated gradient of a leaf tensor after `backward()`; null before. */
  grad: Tensor | null = null;
  /** The tape node that produced this tensor; null for leaves. @internal */
  gradFn: GradNode | null = null;
  #storage: Storage | null;
  #indexRange: IndexRange | null = null;

  /** Use {@link Tensor.from}, {@link Tensor.zeros} or an op; this wraps raw storage. @internal */
  constructor(gpu: Gpu, shape: Shape, dtype: DType, storage?: Storage) {
    this.gpu = gpu;
    this.shape = shape;
    this.dtype = dtype;
    this.requiresGrad = false;
    this.#storage = storage ?? new Storage(
      gpu,
      gpu.pool.acquire(bufferBytes(sizeOf(shape), dtype), `${dtype} tensor ${shapeString(shape)}`),
    );
    track(this);
  }

  /**
   * Uploads host data. `data.length` must equal the number of elements of
   * `shape`; values are converted to `options.dtype` on the CPU.
   *
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { initGpu, Tensor } from "../../mod.ts";
   * const gpu = await initGpu({ matmulTiling: "default" });
   * const x = Tensor.from([1, 2, 3, 4], [2, 2], { dtype: "f16" });
   * assert.equal((await x.read())[3], 4); // read() returns f32 values
   * gpu.destroy();
   * ```
   */
  static from(data: TensorData, shape: Shape, options: TensorOptions = {}): Tensor {
    const dtype = options.dtype ?? "f32";
    assertDType("Tensor.from", dtype);
    assertValidShape("Tensor.from", shape);
    if (typeof (data as ArrayLike<number> | null)?.length !== "number") {
      fail(
        ValueError,
        "Tensor.from",
        `data must be an array or typed array of numbers, got ${shortValue(data)}.`,
      );
    }
    const size = sizeOf(shape);
    if (data.length !== size) {
      fail(
        ShapeError,
        "Tensor.from",
        `data has ${data.length} values but shape ${shapeString(shape)} ` +
          `(${dtype}) needs ${size}. Pass data whose length is the product of the shape.`,
      );
    }
    if (dtype === "i32") checkIndices(data, shape);
    if (dtype === "i32" && options.requiresGrad) {
      fail(DTypeError, "Tensor.from", `an i32 tensor ${shapeString(shape)} cannot require grad.`);
    }
    const t = Tensor.empty(shape, dtype, options.gpu);
    if (dtype === "i32") t.#indexRange = indexRange(data);
    const host = dtype === "f32"
      ? Float32Array.from(data)
      : dtype === "f16"
      ? Float16Array.from(data)
      : dtype === "bf16"
      ? bf16FromF32(data)
      : Int32Array.from(data);
    t.writeBytes(new Uint8Array(host.buffer, 0, host.byteLength));
    t.requiresGrad = options.requiresGrad ?? false;
    return t;
  }

  /** A tensor of zeros. */
  static zeros(shape: Shape, options: TensorOptions = {}): Tensor {
    return Tensor.#filled("Tensor.zeros", shape, 0, options);
  }

  /** A tensor with every element equal to `value`. */
  static full(shape: Shape, value: number, options: TensorOptions = {}): Tensor {
    return Tensor.#filled("Tensor.full", shape, value, options);
  }

  static #filled(op: string, shape: Shape, value: number, options: TensorOptions): Tensor {
    const dtype = options.dtype ?? "f32";
    assertDType(op, dtype);
    assertValidShape(op, shape);
    // Before the host array: V8 would throw its own RangeError for a huge one.
    assertTensorFits(op, shape, dtype, options.gpu ?? getGpu());
    return Tensor.from(new Float32Array(sizeOf(shape)).fill(value), shape, options);
  }

  /**
   * An uninitialised tensor: its contents are whatever the pooled buffer held.
   * Kernels use it for outputs they overwrite completely.
   */
  static empty(shape: Shape, dtype: DType = "f32", gpu: Gpu = getGpu()): Tensor {
    assertDType("Tensor.empty", dtype);
    assertValidShape("Tensor.empty", shape);
    assertTensorFits("Tensor.empty", shape, dtype, gpu);
    if (dtype === "f16" && !gpu.f16) {
      fail(
        DTypeError,
        "Tensor",
        `cannot create an f16 tensor of shape ${shapeString(shape)}: f16 is off on this device ` +
          "(the adapter has no shader-f16, or initGpu({ f16: 'off' }) was used). Use f32.",
      );
    }
    return new Tensor(gpu, shape, dtype);
  }

  /**
   * For i32 tensors uploaded from host data: the smallest and largest value,
   * known without a GPU read, so ops can reject out-of-range ids up front.
   */
  get indexRange(): IndexRange | null {
    return this.#indexRange;
  }

  /** Number of elements. */
  get size(): number {
    return sizeOf(this.shape);
  }

  /** Number of dimensions. */
  get rank(): number {
    return this.shape.length;
  }

  /** True once `dispose()` ran; the tensor can no longer be used. */
  get disposed(): boolean {
    return this.#storage === null;
  }

  /** The GPU buffer (may be larger than the data). Throws after dispose. */
  get buffer(): GPUBuffer {
    return this.#live("use").buffer;
  }

  /** `f32 [2, 3]`, as errors print it. */
  describe(): string {
    return `${this.dtype} ${shapeString(this.shape)}`;
  }

  /**
   * Copies the values to the CPU: an `Int32Array` for an i32 tensor (exact
   * over its whole range, where f32 would round above 2²⁴), a `Float32Array`
   * for f32, f16 and bf16 ones (their exact values). **A sync point**: submits pending work and waits
   * for the GPU, so call it to log, not inside a training step.
   */
  async read(): Promise<TensorValues> {
    const storage = this.#live("read");
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
   * Overwrites the contents with raw little-endian bytes in this tensor's
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
    this.gpu.batch.write(this.#live("write").buffer, padded);
  }

  /** Overwrites the contents with those of `source` (same shape and dtype), on the GPU. */
  copyFrom(source: Tensor): void {
    if (source.dtype !== this.dtype || !sameShape(source.shape, this.shape)) {
      fail(
        source.dtype !== this.dtype ? DTypeError : ShapeError,
        "Tensor.copyFrom",
        `source ${source.describe()} does not match ${this.describe()}.`,
      );
    }
    this.gpu.batch.copy(
      source.buffer,
      this.#live("write").buffer,
      bufferBytes(this.size, this.dtype),
    );
  }

  /** The single value of a one-element tensor. **A sync point**, like `read()`. */
  async item(): Promise<number> {
    if (this.size !== 1) {
      fail(
        ShapeError,
        "Tensor.item",
        `tensor ${this.describe()} has ${this.size} elements; item() needs exactly 1.`,
      );
    }
    return (await this.read())[0];
  }

  /**
   * A second handle to the same GPU memory, optionally with another shape of
   * the same size; the memory stays alive until every handle is disposed.
   * The autograd tape saves activations this way; `reshape` is built on it.
   */
  share(shape: Shape = this.shape): Tensor {
    if (sizeOf(shape) !== this.size) {
      fail(ShapeError, "Tensor.share", `cannot view ${this.describe()} as ${shapeString(shape)}.`);
    }
    return new Tensor(this.gpu, shape, this.dtype, this.#live("share").retain());
  }

  /**
   * Backpropagates from this tensor into the `.grad` of every leaf that
   * requires grad (see {@link backward}). Does not wait for the GPU.
   */
  backward(options: BackwardOptions = {}): void {
    if (!this.gradFn) {
      fail(
        StateError,
        "backward",
        `tensor ${this.describe()} does not require grad; ` +
          "none of the inputs it was computed from has requiresGrad set.",
      );
    }
    this.gradFn.backpropagate(this, options);
  }

  /** True when both handles view the same GPU memory (see {@link Tensor.share}). */
  sharesMemoryWith(other: Tensor): boolean {
    return this.#storage !== null && this.#storage === other.#storage;
  }

  /** Returns the buffer to the pool. Idempotent; the tensor is unusable afterwards. */
  dispose(): void {
    if (this.#storage === null) return;
    this.#storage.release();
    this.#storage = null;
    // The graph node stays reachable for a pending backward through its
    // consumers; only its hold from this handle ends here.
    this.gradFn?.drop();
  }

  #live(what: string): Storage {
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
