/**
 * Mutated safetensors files for fuzz tests: header and data bit flips, swaps
 * of same-size `data_offsets`, dtype relabels, truncation, JSON and metadata
 * edits, each a pure function of (file, seed, index), so a failing mutant is
 * reproduced by its seed and index. Works on any safetensors file (module
 * files, training states).
 */

/** A parsed header: name → entry, plus `__metadata__`. */
export type Header = Record<string, unknown>;

/** The header length, the header object and the data buffer of a file (no validation). */
export function splitFile(bytes: Uint8Array): { header: Header; data: Uint8Array } {
  const n = Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  return { header, data: bytes.subarray(8 + n) };
}

/** A file from a header (JSON text or object) and data, padded with spaces to a multiple of 8. */
export function joinFile(header: Header | string, data: Uint8Array): Uint8Array {
  const json = new TextEncoder().encode(
    typeof header === "string" ? header : JSON.stringify(header),
  );
  const padded = Math.ceil(json.byteLength / 8) * 8;
  const out = new Uint8Array(8 + padded + data.byteLength).fill(0x20, 8, 8 + padded);
  new DataView(out.buffer).setBigUint64(0, BigInt(padded), true);
  out.set(json, 8);
  out.set(data, 8 + padded);
  return out;
}

/** `bytes` with its header object changed by `edit` (the data is kept as is). */
export function rewriteHeader(bytes: Uint8Array, edit: (header: Header) => void): Uint8Array {
  const { header, data } = splitFile(bytes);
  edit(header);
  return joinFile(header, data);
}
