/**
 * The safetensors format (https://github.com/huggingface/safetensors), in
 * pure Web APIs so that it runs in browsers too; the Deno file side lives in
 * `safetensors_file.ts`.
 *
 * Layout: an 8-byte little-endian u64 `N`, `N` bytes of UTF-8 JSON
 * (`{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 * "__metadata__": {..}}`, padded with spaces to a multiple of 8), then the
 * little-endian data buffer; offsets are relative to the data buffer, which
 * the tensors cover exactly, without holes or overlaps.
 */
import {
  bytesPerElement,
  cut,
  type DType,
  type Gpu,
  quoted,
  shapeString,
  sizeOf,
  Tensor,
} from "../gpu/mod.ts";
import {
  CHECKSUMS_KEY,
  refuseReservedKey,
  type StoredTensor,
  verifyChecksums,
  withChecksums,
} from "./checksum.ts";
import { SafetensorsError } from "./safetensors_error.ts";

/** One tensor as the file stores it. */
export interface SafetensorsEntry {
  /** Element type (the toolkit's `DType`, spelled out so this module documents itself). */
  dtype: "f32" | "f16" | "bf16" | "i32";
  /** Extents, outermost first (row-major); `[]` is a scalar. */
  shape: number[];
  /** Raw little-endian bytes: exactly `size(shape) · bytes(dtype)` of them. */
  data: Uint8Array;
}

/** A tensor's description without its data, as the header records it. */
export interface SafetensorsSpec {
  /** Element type. */
  dtype: "f32" | "f16" | "bf16" | "i32";
  /** Extents, outermost first. */
  shape: readonly number[];
}

export { SafetensorsError };

/** The reference implementation refuses headers over 100 MB; so do we (it also bounds memory). */
const MAX_HEADER_BYTES = 100_000_000;
const METADATA_KEY = "__metadata__";
const FILE_DTYPE: Record<DType, string> = { f32: "F32", f16: "F16", bf16: "BF16", i32: "I32" };
/**
 * Dtypes halfstep reads, as what it holds them in: its own, plus what PyTorch
 * writes into state dicts as I64 (narrowed to i32 when every value fits:
 * `num_batches_tracked`). BF16 loads as bf16, bit for bit; loading it into
 * f32 parameters widens it exactly (`Module.loadStateDict`).
 */
const READ_AS: Record<string, { ours: DType; bytes: number }> = {
  F32: { ours: "f32", bytes: 4 },
  F16: { ours: "f16", bytes: 2 },
  I32: { ours: "i32", bytes: 4 },
  BF16: { ours: "bf16", bytes: 2 },
  I64: { ours: "i32", bytes: 8 },
};
/** Dtypes of the format that halfstep cannot hold (so the error can say "not supported"). */
const OTHER_DTYPES = new Set("BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 U32 F64 U64".split(" "));

/** `data` in the file's dtype as bytes of the dtype halfstep holds it in. */
function widen(where: string, fileDtype: string, data: Uint8Array): Uint8Array {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  if (fileDtype === "I64") {
    const out = new Int32Array(data.byteLength / 8);
    for (let i = 0; i < out.length; i++) {
      const v = view.getBigInt64(8 * i, true);
      if (v < -(2n ** 31n) || v >= 2n ** 31n) {
        throw new SafetensorsError(`${where}: I64 value ${v} does not fit the i32 it loads into.`);
      }
      out[i] = Number(v);
    }
    return new Uint8Array(out.buffer);
  }
  return data;
}
/**
 * Data order: descending alignment, then name. NOTE: this is the reference
 * implementation's order (`Reverse(dtype)`: its enum lists F16, BF16, I32, F32,
 * so F32, I32, BF16, F16; then name), not plain name order:
 * with an 8-aligned header it keeps every tensor aligned to its element size
 * in the file (zero-copy typed-array views), stays deterministic, and lays
 * files out as Python's `safetensors` does (byte-identical when metadata has
 * at most one key: the reference writes metadata in hash-map order, we sort).
 */
const ORDER: Record<DType, number> = { f32: 0, i32: 1, bf16: 2, f16: 3 };

/** Throws unless `shape` is an array of non-negative safe integers with a safe byte size. */
function checkShape(where: string, shape: unknown, dtype: DType, elementBytes?: number): number {
  if (
    !Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && (d as number) >= 0)
  ) {
    throw new SafetensorsError(
      `${where}: shape ${cut(JSON.stringify(shape) ?? "undefined")} must be an array of ` +
        "non-negative integers.",
    );
  }
  const bytes = sizeOf(shape as number[]) * (elementBytes ?? bytesPerElement(dtype));
  if (!Number.isSafeInteger(bytes)) {
    throw new SafetensorsError(`${where}: shape ${cut(shapeString(shape))} is too large.`);
  }
  return bytes;
}

/** `Object.hasOwn`, not `in`: `"toString" in FILE_DTYPE` is true. */
function checkDType(where: string, dtype: unknown): void {
  if (!Object.hasOwn(FILE_DTYPE, String(dtype))) {
    throw new SafetensorsError(
      `${where}: dtype ${cut(String(dtype))} is not f32, f16, bf16 or i32.`,
    );
  }
}

function checkEntry(where: string, e: SafetensorsEntry): void {
  checkDType(where, e.dtype);
  const bytes = checkShape(where, e.shape, e.dtype);
  if (!(e.data instanceof Uint8Array) || e.data.byteLength !== bytes) {
    throw new SafetensorsError(
      `${where}: a ${e.dtype} tensor ${shapeString(e.shape)} needs ${bytes} bytes of data ` +
        `but has ${e.data instanceof Uint8Array ? e.data.byteLength : "no Uint8Array"}.`,
    );
  }
}

/**
 * The 8-byte length prefix plus the padded JSON header for tensors described
 * by `specs`, and the order their data must follow it in. Streaming writers
 * (`saveSafetensors`) write this, then each tensor's bytes in `order`.
 *
 * @param specs Name → dtype and shape of every tensor.
 * @param metadata Optional free-form string → string map (`__metadata__`).
 * @returns `prefix` (length + header) and the tensor names in data order.
 */
export function encodeSafetensorsHeader(
  specs: Map<string, SafetensorsSpec>,
  metadata?: Record<string, string>,
): { prefix: Uint8Array; order: string[] } {
  const header: Record<string, unknown> = {};
  if (metadata !== undefined) {
    const keys = Object.keys(metadata).sort();
    for (const k of keys) {
      if (typeof metadata[k] !== "string") {
        throw new SafetensorsError(
          `encodeSafetensors: metadata ${quoted(k)} must be a string, got ${typeof metadata[k]}.`,
        );
      }
    }
    header[METADATA_KEY] = Object.fromEntries(keys.map((k) => [k, metadata[k]]));
  }
  const sizes = new Map<string, number>();
  for (const [name, { dtype, shape }] of specs) {
    const where = `encodeSafetensors: tensor ${quoted(name)}`;
    if (name === METADATA_KEY) {
      throw new SafetensorsError(`${where}: the name is reserved for metadata; rename it.`);
    }
    checkDType(where, dtype);
    sizes.set(name, checkShape(where, shape, dtype));
  }
  const order = [...specs.keys()].sort((a, b) =>
    ORDER[specs.get(a)!.dtype] - ORDER[specs.get(b)!.dtype] || (a < b ? -1 : a > b ? 1 : 0)
  );
  let offset = 0;
  for (const name of order) {
    const { dtype, shape } = specs.get(name)!;
    const end = offset + sizes.get(name)!;
    // Object.defineProperty: a tensor named "__proto__" must stay an own key.
    Object.defineProperty(header, name, {
      value: { dtype: FILE_DTYPE[dtype], shape: [...shape], data_offsets: [offset, end] },
      enumerable: true,
    });
    offset = end;
  }
  const json = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil(json.byteLength / 8) * 8;
  const prefix = new Uint8Array(8 + padded).fill(0x20, 8 + json.byteLength);
  new DataView(prefix.buffer).setBigUint64(0, BigInt(padded), true);
  prefix.set(json, 8);
  return { prefix, order };
}

/** Options of {@link encodeSafetensors}. */
export interface EncodeOptions {
  /** Free-form string → string map (`__metadata__`); the key `"halfstep.checksums"` is reserved. */
  metadata?: Record<string, string>;
  /**
   * Store a checksum per tensor and one over the metadata (default true), which
   * `decodeSafetensors` verifies; false writes exactly what the reference
   * implementation would.
   */
  checksums?: boolean;
}

/** Entries as the file stores them, for checksums (our dtypes are spelled as the file spells them). */
export function storedTensors(
  entries: ReadonlyMap<string, SafetensorsEntry>,
): [string, StoredTensor][] {
  return [...entries].map((
    [name, e],
  ) => [name, { fileDtype: FILE_DTYPE[e.dtype], shape: e.shape, data: e.data }]);
}

/**
 * Serialises tensors to safetensors bytes, laid out as the reference
 * implementation does: data ordered by alignment then name, header padded
 * with spaces to a multiple of 8 bytes. By default the metadata also holds a
 * checksum per tensor (see `checksum.ts`), which readers that ignore
 * metadata (PyTorch) do not see.
 *
 * @param entries Name → tensor; byte lengths are checked against shape and dtype.
 * @param options `metadata` (string → string) and `checksums` (default true).
 * @returns The whole file.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { decodeSafetensors, encodeSafetensors } from "./mod.ts";
 * const data = new Uint8Array(new Float32Array([1, 2]).buffer);
 * const file = encodeSafetensors(new Map([["w", { dtype: "f32", shape: [2], data }]]));
 * assert.equal(decodeSafetensors(file).entries.get("w")?.shape.join(), "2");
 * ```
 */
export function encodeSafetensors(
  entries: Map<string, SafetensorsEntry>,
  options: EncodeOptions = {},
): Uint8Array {
  for (const [name, e] of entries) checkEntry(`encodeSafetensors: tensor ${quoted(name)}`, e);
  refuseReservedKey("encodeSafetensors", options.metadata);
  const metadata = options.checksums === false
    ? options.metadata
    : withChecksums(storedTensors(entries), options.metadata);
  const { prefix, order } = encodeSafetensorsHeader(entries, metadata);
  const parts = [prefix, ...order.map((name) => entries.get(name)!.data)];
  const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
  parts.reduce((at, p) => (out.set(p, at), at + p.byteLength), 0);
  return out;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * Parses and validates safetensors bytes: header length, UTF-8, JSON, every
 * dtype, shape and offset, that the tensors tile the data buffer exactly, and
 * the checksums halfstep stores (files without them, like PyTorch's, load).
 * The returned `data` arrays are views into `bytes` (no copy), BF16 included
 * (it loads as bf16), except for I64, which PyTorch writes for counters:
 * narrowed to i32 (an error if a value does not fit), as a new array.
 *
 * @param bytes The whole file.
 * @returns The tensors by name and the `__metadata__` map (`{}` when absent),
 * without the checksums.
 * @throws {SafetensorsError} naming what is wrong: truncated file, bad JSON,
 * unknown dtype, bad shape, offsets that overlap, leave holes or run past the
 * end, a checksum that does not match (naming the tensor, or the metadata).
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { decodeSafetensors, encodeSafetensors } from "./mod.ts";
 * const file = encodeSafetensors(new Map(), { metadata: { step: "100" } });
 * const { entries, metadata } = decodeSafetensors(file);
 * assert.equal(entries.size, 0);
 * assert.equal(metadata.step, "100");
 * ```
 */
export function decodeSafetensors(
  bytes: Uint8Array,
): { entries: Map<string, SafetensorsEntry>; metadata: Record<string, string> } {
  const length = bytes.byteLength;
  if (length < 8) {
    throw new SafetensorsError(
      `The file is ${length} bytes, shorter than the 8-byte header length.`,
    );
  }
  const n = new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true);
  if (n > BigInt(MAX_HEADER_BYTES)) {
    throw new SafetensorsError(`The header length ${n} exceeds 100 MB; corrupt file?`);
  }
  const headerEnd = 8 + Number(n);
  if (headerEnd > length) {
    throw new SafetensorsError(
      `The file is truncated: the header needs ${n} bytes but only ${length - 8} follow.`,
    );
  }
  let header: unknown;
  try {
    header = JSON.parse(
      new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(8, headerEnd)),
    );
  } catch (err) {
    throw new SafetensorsError(`The header is not valid UTF-8 JSON: ${cut(String(err))}`, {
      cause: err,
    });
  }
  if (!isObject(header)) {
    throw new SafetensorsError("The header must be a JSON object of tensor name → info.");
  }
  const data = bytes.subarray(headerEnd);
  let metadata: Record<string, string> = {};
  const infos: {
    name: string;
    fileDtype: string;
    dtype: DType;
    shape: number[];
    begin: number;
    end: number;
  }[] = [];
  for (const [name, info] of Object.entries(header)) {
    if (name === METADATA_KEY) {
      if (!isObject(info) || !Object.values(info).every((v) => typeof v === "string")) {
        throw new SafetensorsError(`"${METADATA_KEY}" must be an object of string values.`);
      }
      metadata = Object.fromEntries(Object.entries(info as Record<string, string>));
      continue;
    }
    const where = `Tensor ${quoted(name)}`;
    if (!isObject(info)) {
      throw new SafetensorsError(`${where}: its header entry must be an object.`);
    }
    const { dtype, shape, data_offsets: offsets } = info;
    if (typeof dtype !== "string") {
      throw new SafetensorsError(
        `${where}: dtype ${cut(JSON.stringify(dtype) ?? "undefined")} is missing.`,
      );
    }
    if (OTHER_DTYPES.has(dtype)) {
      throw new SafetensorsError(
        `${where}: dtype ${dtype} is not supported (F32, F16, BF16, I32; I64 is converted).`,
      );
    }
    if (!Object.hasOwn(READ_AS, dtype)) {
      throw new SafetensorsError(`${where}: unknown dtype ${quoted(dtype)}.`);
    }
    const ours = READ_AS[dtype].ours;
    const size = checkShape(where, shape, ours, READ_AS[dtype].bytes);
    if (
      !Array.isArray(offsets) || offsets.length !== 2 ||
      !offsets.every((o) => Number.isSafeInteger(o) && (o as number) >= 0)
    ) {
      throw new SafetensorsError(
        `${where}: data_offsets ${cut(JSON.stringify(offsets) ?? "undefined")} must be ` +
          "[begin, end] integers.",
      );
    }
    const [begin, end] = offsets as number[];
    if (end - begin !== size) {
      throw new SafetensorsError(
        `${where}: data_offsets [${begin}, ${end}] span ${end - begin} bytes but a ${dtype} ` +
          `tensor ${cut(shapeString(shape as number[]))} needs ${size}.`,
      );
    }
    infos.push({ name, fileDtype: dtype, dtype: ours, shape: shape as number[], begin, end });
  }
  infos.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let cursor = 0, previous = "the start of the data buffer";
  for (const { name, begin, end } of infos) {
    if (begin < cursor) {
      throw new SafetensorsError(`Tensor ${quoted(name)} [${begin}, ${end}) overlaps ${previous}.`);
    }
    if (begin > cursor) {
      throw new SafetensorsError(
        `The data buffer has a hole of ${begin - cursor} bytes before tensor ${quoted(name)}.`,
      );
    }
    if (end > data.byteLength) {
      throw new SafetensorsError(
        `The file is truncated: tensor ${quoted(name)} ends at data byte ${end} of ` +
          `${data.byteLength}.`,
      );
    }
    cursor = end;
    previous = `tensor ${quoted(name)} (which ends at ${end})`;
  }
  if (cursor !== data.byteLength) {
    throw new SafetensorsError(
      `The data buffer has ${data.byteLength - cursor} unused bytes after the last tensor.`,
    );
  }
  const stored = new Map<string, StoredTensor>(
    infos.map(({ name, fileDtype, shape, begin, end }) => [
      name,
      { fileDtype, shape, data: data.subarray(begin, end) },
    ]),
  );
  verifyChecksums(stored, metadata);
  delete metadata[CHECKSUMS_KEY];
  const entries = new Map<string, SafetensorsEntry>();
  for (const { name, fileDtype, dtype, shape } of infos) {
    const bytes = widen(`Tensor ${quoted(name)}`, fileDtype, stored.get(name)!.data);
    entries.set(name, { dtype, shape, data: bytes });
  }
  return { entries, metadata };
}

/**
 * Copies a tensor's raw bytes to the CPU, bit-exactly (NaN payloads, -0,
 * i32 beyond 2^24 included). **A sync point**: waits for the GPU unless the
 * tensor is empty. Several calls started together share one wait.
 *
 * @param t The tensor; throws if it was disposed.
 * @returns Its dtype, shape and little-endian bytes.
 */
export async function tensorToEntry(t: Tensor): Promise<SafetensorsEntry> {
  // NOTE: raw bytes, not `t.read()`: read() widens to f32, which is not exact
  // for i32 values beyond ±2^24 and may canonicalise NaN payloads. WGSL lays
  // scalars out little-endian, which is the format's byte order.
  // The copy is recorded and submitted before readBuffer awaits, so a dispose
  // during the wait cannot hand the buffer to someone else first.
  const buffer = t.buffer; // throws a clear error after dispose
  const bytes = t.size * bytesPerElement(t.dtype);
  const data = bytes === 0
    ? new Uint8Array(0)
    : new Uint8Array(await t.gpu.readBuffer(buffer, bytes));
  return { dtype: t.dtype, shape: [...t.shape], data };
}

/**
 * Uploads an entry as a new tensor, bit-exactly. Does not wait for the GPU.
 *
 * @param e The entry; its byte length is checked against shape and dtype.
 * @param options `gpu`: the device (default: the one `initGpu()` made).
 * @returns A tensor that the caller owns (dispose it when done).
 */
export function entryToTensor(e: SafetensorsEntry, options: { gpu?: Gpu } = {}): Tensor {
  checkEntry("entryToTensor", e);
  const view = new DataView(e.data.buffer, e.data.byteOffset, e.data.byteLength);
  if (e.dtype === "i32") {
    // Through Tensor.from so the tensor knows its index range, as uploaded ids do.
    const ids = new Int32Array(e.data.byteLength / 4);
    for (let i = 0; i < ids.length; i++) ids[i] = view.getInt32(4 * i, true);
    return Tensor.from(ids, e.shape, { dtype: "i32", gpu: options.gpu });
  }
  // Floats: raw bytes straight into the buffer (Tensor.from would convert values).
  const t = Tensor.empty(e.shape, e.dtype, options.gpu);
  const padded = new Uint8Array(Math.max(4, Math.ceil(e.data.byteLength / 4) * 4));
  padded.set(e.data);
  t.gpu.batch.write(t.buffer, padded);
  return t;
}
