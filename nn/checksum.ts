/**
 * Checksums in safetensors files: one per tensor, over its name, file dtype
 * ("F16"), shape and bytes, so a flipped bit, two same-size tensors whose
 * `data_offsets` were swapped and an F16 tensor relabelled BF16 are all
 * caught; and one over the rest of the metadata (optimizer hyper-parameters,
 * trainer counters, user data). They live in `__metadata__` under one reserved
 * key (JSON name → hex, the metadata's under `"__metadata__"`, a name no
 * tensor may have), so readers that ignore metadata (PyTorch) are unaffected.
 *
 * NOTE: CRC-32C (Castagnoli), table-driven, in plain TypeScript: it runs in
 * browsers and synchronously (WebCrypto's digests are async only), it
 * detects every single-bit error and every burst up to 32 bits — what disk,
 * copy and hand-edit damage look like — and slicing-by-8 (eight 256-entry
 * tables) reads 8 bytes per step. It guards against accidents, not attackers.
 */
import { quoted } from "../gpu/mod.ts";
import { SafetensorsError } from "./safetensors_error.ts";

/** The metadata key that holds the checksums (refused in user metadata). */
export const CHECKSUMS_KEY = "halfstep.checksums";
/** The checksums' entry for the metadata itself (no tensor may be called this). */
const METADATA_ENTRY = "__metadata__";

/** CRC-32C, reflected polynomial 0x82F63B78; table s advances a byte by s + 1 positions. */
const TABLES = (() => {
  const t = new Uint32Array(8 * 256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[i] = c;
  }
  for (let s = 1; s < 8; s++) {
    for (let i = 0; i < 256; i++) {
      const prev = t[(s - 1) * 256 + i];
      t[s * 256 + i] = (prev >>> 8) ^ t[prev & 0xff];
    }
  }
  return t;
})();

/**
 * CRC-32C of `bytes`, continuing from `crc` (the checksum of what came before).
 *
 * @param bytes The data.
 * @param crc The CRC of the preceding bytes (0 to start).
 * @returns An unsigned 32-bit CRC.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { crc32c } from "./checksum.ts";
 * const text = new TextEncoder().encode("123456789");
 * assert.equal(crc32c(text), 0xe3069283); // the standard check value
 * assert.equal(crc32c(text.subarray(4), crc32c(text.subarray(0, 4))), 0xe3069283);
 * ```
 */
export function crc32c(bytes: Uint8Array, crc = 0): number {
  const t = TABLES, b = bytes, n = b.length;
  let c = ~crc >>> 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const x = c ^ (b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24));
    c = t[1792 + (x & 0xff)] ^ t[1536 + ((x >>> 8) & 0xff)] ^ t[1280 + ((x >>> 16) & 0xff)] ^
      t[1024 + (x >>> 24)] ^ t[768 + b[i + 4]] ^ t[512 + b[i + 5]] ^ t[256 + b[i + 6]] ^
      t[b[i + 7]];
  }
  for (; i < n; i++) c = t[(c ^ b[i]) & 0xff] ^ (c >>> 8);
  return ~c >>> 0;
}

/** One tensor as the file stores it: its dtype as the file spells it, and its raw bytes. */
export interface StoredTensor {
  /** The file's dtype string, e.g. "F16". */
  fileDtype: string;
  /** Extents. */
  shape: readonly number[];
  /** The bytes in the file. */
  data: Uint8Array;
}

const hex = (crc: number): string => crc.toString(16).padStart(8, "0");

function tensorChecksum(name: string, t: StoredTensor): string {
  const described = new TextEncoder().encode(JSON.stringify([name, t.fileDtype, t.shape]));
  return hex(crc32c(t.data, crc32c(described)));
}

function metadataChecksum(metadata: Record<string, string>): string {
  const rest = Object.entries(metadata).filter(([k]) => k !== CHECKSUMS_KEY)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return hex(crc32c(new TextEncoder().encode(JSON.stringify(rest))));
}

/** Throws when user metadata uses the reserved key. */
export function refuseReservedKey(where: string, metadata: Record<string, string> = {}): void {
  if (Object.hasOwn(metadata, CHECKSUMS_KEY)) {
    throw new SafetensorsError(
      `${where}: metadata key "${CHECKSUMS_KEY}" is reserved (halfstep keeps its checksums ` +
        "there); rename it.",
    );
  }
}

/** `metadata` plus the checksums of `tensors` and of `metadata` itself. */
export function withChecksums(
  tensors: Iterable<[string, StoredTensor]>,
  metadata: Record<string, string> = {},
): Record<string, string> {
  const sums: [string, string][] = [[METADATA_ENTRY, metadataChecksum(metadata)]];
  for (const [name, t] of tensors) sums.push([name, tensorChecksum(name, t)]);
  return { ...metadata, [CHECKSUMS_KEY]: JSON.stringify(Object.fromEntries(sums)) };
}

/**
 * Checks a decoded file's checksums, if it has any (PyTorch's and older
 * halfstep files have none and pass). Throws a {@link SafetensorsError}
 * naming the first damaged tensor, or "the metadata".
 */
export function verifyChecksums(
  tensors: ReadonlyMap<string, StoredTensor>,
  metadata: Record<string, string>,
): void {
  if (!Object.hasOwn(metadata, CHECKSUMS_KEY)) return;
  let sums: unknown;
  try {
    sums = JSON.parse(metadata[CHECKSUMS_KEY]);
  } catch {
    sums = null;
  }
  const valid = typeof sums === "object" && sums !== null && !Array.isArray(sums) &&
    Object.values(sums).every((v) => typeof v === "string");
  if (!valid) {
    throw new SafetensorsError(
      `The metadata's "${CHECKSUMS_KEY}" is not a JSON object of hex strings (damaged file?).`,
    );
  }
  const expected = new Map(Object.entries(sums as Record<string, string>));
  const damage = "was changed after saving (damaged or edited file?)";
  if (expected.get(METADATA_ENTRY) !== metadataChecksum(metadata)) {
    throw new SafetensorsError(`The metadata: checksum mismatch: it ${damage}.`);
  }
  for (const [name, t] of tensors) {
    const sum = expected.get(name);
    if (sum === undefined) {
      throw new SafetensorsError(
        `Tensor ${quoted(name)} has no checksum: it was added after saving (edited file?).`,
      );
    }
    if (sum !== tensorChecksum(name, t)) {
      throw new SafetensorsError(
        `Tensor ${quoted(name)}: checksum mismatch: its data, dtype, shape or position ${damage}.`,
      );
    }
  }
  for (const name of expected.keys()) {
    if (name !== METADATA_ENTRY && !tensors.has(name)) {
      throw new SafetensorsError(
        `Tensor ${quoted(name)} is missing: it was removed after saving (damaged or edited file?).`,
      );
    }
  }
}
