/**
 * Tensor: a device array (a shape, a dtype and a GPU buffer from the pool)
 * that the autograd tape and tidy scopes know. Ops wrap the arrays their
 * kernels return in tensors (`Tensor.adopt`). Reading values back (`read`,
 * `item`) is the only thing that waits for the GPU.
 */
import { assertDType, type DType } from "../base/dtype.ts";
import { getGpu, type Gpu } from "../device/gpu.ts";
import {
  type ArrayStorage,
  type ArrayValues,
  assertArrayFits,
  checkAllocation,
  DeviceArray,
  hostBytes,
} from "../device/device_array.ts";
import { DTypeError, fail, ShapeError, StateError, ValueError } from "../base/errors.ts";
import { assertValidShape, type Shape, shapeString, sizeOf } from "../base/shape.ts";
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
export type TensorValues = ArrayValues;

/** Options for creating a tensor. */
export interface TensorOptions {
  /** Element type on the GPU (default `"f32"`). */
  dtype?: DType;
  /** Whether autograd should compute a gradient for this tensor (default false). */
  requiresGrad?: boolean;
  /** The device (default: the one `initGpu()` made). */
  gpu?: Gpu;
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

/** An n-dimensional array of f32, f16, bf16 or i32 values on the GPU, known to the tape. */
export class Tensor extends DeviceArray {
  /** Whether autograd tracks this tensor. */
  requiresGrad = false;
  /** Accumulated gradient of a leaf tensor after `backward()`; null before. */
  grad: Tensor | null = null;
  /**
   * The dtype `backward()` keeps this leaf's {@link Tensor.grad} in; null
   * (default): the tensor's own. An fp32 master weight may keep a
   * half-precision gradient (apex O2, `AmpTrainer({ gradDtype })`): products
   * write its weight gradient in that dtype from their f32 accumulators, and
   * a gradient that arrives in the tensor's own dtype is narrowed once.
   * Setting anything but a float dtype (f16 only with shader-f16) or null
   * is a DTypeError.
   */
  get gradDtype(): DType | null {
    return this.#gradDtype;
  }
  set gradDtype(dtype: DType | null) {
    const float = dtype === null || dtype === "f32" || dtype === "bf16" ||
      (dtype === "f16" && this.gpu.f16);
    if (!float) {
      fail(
        DTypeError,
        "Tensor.gradDtype",
        `${shortValue(dtype)} cannot hold the gradient of ${this.describe()}; use "f32", "bf16"` +
          `${this.gpu.f16 ? ', "f16"' : ""} or null${
            dtype === "f16" ? " (this device has no shader-f16)" : ""
          }.`,
      );
    }
    this.#gradDtype = dtype;
  }
  #gradDtype: DType | null = null;
  /** The tape node that produced this tensor; null for leaves. @internal */
  gradFn: GradNode | null = null;
  #indexRange: IndexRange | null = null;

  /** Use {@link Tensor.from}, {@link Tensor.zeros} or an op; this wraps raw storage. @internal */
  constructor(gpu: Gpu, shape: Shape, dtype: DType, storage?: ArrayStorage) {
    super(gpu, shape, dtype, storage);
    track(this);
  }

  /**
   * A kernel's result as a tensor (what ops return, as TensorFlow.js's
   * `makeTensorFromTensorInfo`): the tensor takes over the array's buffer,
   * and the array is spent. A result that is a tensor already stays itself.
   */
  static adopt(array: DeviceArray): Tensor {
    if (array instanceof Tensor) return array;
    return new Tensor(array.gpu, array.shape, array.dtype, array.takeStorage());
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
    t.writeBytes(hostBytes(data, dtype));
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
    assertArrayFits(op, shape, dtype, options.gpu ?? getGpu());
    return Tensor.from(new Float32Array(sizeOf(shape)).fill(value), shape, options);
  }

  /**
   * An uninitialised tensor: its contents are whatever the pooled buffer held.
   * For outputs overwritten completely.
   */
  static override empty(shape: Shape, dtype: DType = "f32", gpu: Gpu = getGpu()): Tensor {
    checkAllocation("Tensor.empty", shape, dtype, gpu);
    return new Tensor(gpu, shape, dtype);
  }

  /**
   * For i32 tensors uploaded from host data: the smallest and largest value,
   * known without a GPU read, so ops can reject out-of-range ids up front.
   */
  get indexRange(): IndexRange | null {
    return this.#indexRange;
  }

  /**
   * Overwrites the values with host data of this tensor's size, converted
   * to its dtype on the CPU as {@link Tensor.from} does (an i32 tensor takes
   * the data's id range), in stream order. No sync.
   *
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { initGpu, Tensor } from "../../mod.ts";
   * const gpu = await initGpu({ matmulTiling: "default" });
   * const ids = Tensor.from([0, 1, 2], [3], { dtype: "i32" });
   * ids.write([5, 4, 3]);
   * assert.equal(ids.indexRange!.max, 5);
   * assert.deepEqual([...await ids.read()], [5, 4, 3]);
   * gpu.destroy();
   * ```
   */
  write(data: TensorData): void {
    if (typeof (data as ArrayLike<number> | null)?.length !== "number") {
      fail(
        ValueError,
        "Tensor.write",
        `data must be an array of numbers, got ${shortValue(data)}.`,
      );
    }
    if (data.length !== this.size) {
      fail(
        ShapeError,
        "Tensor.write",
        `data has ${data.length} values but ${this.describe()} holds ${this.size}.`,
      );
    }
    if (this.dtype === "i32") checkIndices(data, this.shape);
    this.writeBytes(hostBytes(data, this.dtype));
    if (this.dtype === "i32") this.#indexRange = indexRange(data);
  }

  /**
   * Sets {@link Tensor.indexRange}: a captured step's input, refilled with a
   * new batch's ids on the GPU, takes that batch's range. @internal
   */
  setIndexRange(range: IndexRange | null): void {
    this.#indexRange = range;
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
  override share(shape: Shape = this.shape): Tensor {
    return new Tensor(this.gpu, shape, this.dtype, this.sharedStorage(shape));
  }

  /**
   * Backpropagates from this tensor into the `.grad` of every leaf that
   * requires grad (see `backward` in autograd.ts). Does not wait for the GPU.
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

  /** Returns the buffer to the pool. Idempotent; the tensor is unusable afterwards. */
  override dispose(): void {
    if (this.disposed) return;
    super.dispose();
    // The graph node stays reachable for a pending backward through its
    // consumers; only its hold from this handle ends here.
    this.gradFn?.drop();
  }
}

/** The dtype `backward()` gives `t`'s gradient: its `gradDtype`, else its own dtype. */
export function gradDtypeOf(t: Tensor): DType {
  return t.gradDtype ?? t.dtype;
}
