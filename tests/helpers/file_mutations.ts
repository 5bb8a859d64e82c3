/**
 * Mutated safetensors files for fuzz tests: header and data bit flips, swaps
 * of same-size `data_offsets`, dtype relabels, truncation, JSON and metadata
 * edits, each a pure function of (file, seed, index), so a failing mutant is
 * reproduced by its seed and index. Works on any safetensors file (module
 * files, training states).
 */
import { randomU32 } from "../../gpu/kernels/wgsl/random.ts";

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

/** One mutated file: what was done (`kind`, `detail`) and whether it should still load the same. */
export interface Mutant {
  /** The kind of mutation, e.g. "data-bit", "offset-swap" (see {@link MUTATION_KINDS}). */
  kind: string;
  /** What exactly changed, for the failure message (e.g. the tensor and the bit). */
  detail: string;
  /** The mutated file. */
  bytes: Uint8Array;
  /**
   * True for changes that do not alter anything a loader may use (whitespace,
   * key order): the file must load, with the same values.
   */
  neutral: boolean;
}

/** Dtype relabels: same element size (reinterpreted data) and other sizes (layout errors). */
const RELABEL: Record<string, string[]> = {
  F16: ["BF16", "F32", "I16", "U16"],
  BF16: ["F16", "F32"],
  F32: ["I32", "F16", "U32", "F64"],
  I32: ["F32", "I64", "U32"],
  I64: ["F64", "I32"],
};

/** A small seeded generator over the project's counter-based hash. */
class Dice {
  #counter = 0;
  constructor(readonly seed: number) {}
  /** An integer in [0, n). */
  below(n: number): number {
    return Math.floor((randomU32(this.seed, this.#counter++) / 2 ** 32) * n);
  }
  pick<T>(items: readonly T[]): T {
    return items[this.below(items.length)];
  }
}

type TensorInfo = { dtype: string; shape: number[]; data_offsets: [number, number] };

function tensorNames(header: Header): string[] {
  return Object.keys(header).filter((k) => k !== "__metadata__");
}

function info(header: Header, name: string): TensorInfo {
  return header[name] as TensorInfo;
}

/** A plausible wrong value of any JSON type, for `value`. */
function otherValue(dice: Dice, value: unknown): unknown {
  const numbers = typeof value === "number"
    ? [value + 1, value - 1, -value - 1, value * 2 + 1, 0.5 + value, 1e300, -5, 2 ** 53]
    : [-1, 1.5, 1e300];
  return dice.pick([...numbers, null, "abc", "", true, [], {}, [1, 2], { a: 1 }]);
}

/** A container (object or array) inside `root`, and one of its keys, picked at random. */
function pickSlot(dice: Dice, root: unknown): { parent: Record<string, unknown>; key: string } {
  let parent = root as Record<string, unknown>;
  let key = dice.pick(Object.keys(parent));
  for (let depth = 0; depth < 6; depth++) {
    const child = parent[key];
    if (typeof child !== "object" || child === null || Object.keys(child).length === 0) break;
    if (dice.below(3) === 0) break; // stop early now and then: whole objects change too
    parent = child as Record<string, unknown>;
    key = dice.pick(Object.keys(parent));
  }
  return { parent, key };
}

/** Edits a JSON document held in a string: a value changed, a key dropped, or the text broken. */
function editJsonText(dice: Dice, text: string): { text: string; what: string } {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    value = undefined;
  }
  if (typeof value !== "object" || value === null || Object.keys(value).length === 0) {
    const at = dice.below(text.length + 1);
    return { text: text.slice(0, at) + "x" + text.slice(at), what: `text edited at ${at}` };
  }
  const { parent, key } = pickSlot(dice, value);
  switch (dice.below(3)) {
    case 0:
      delete parent[key];
      return { text: JSON.stringify(value), what: `dropped ${key}` };
    case 1:
      parent[key] = otherValue(dice, parent[key]);
      return { text: JSON.stringify(value), what: `${key} = ${JSON.stringify(parent[key])}` };
    default: {
      const json = JSON.stringify(value);
      const at = dice.below(json.length);
      return { text: json.slice(0, at), what: `cut at ${at} of ${json.length}` };
    }
  }
}

/** Every kind of mutation {@link mutations} makes. */
export const MUTATION_KINDS = [
  "length-bit",
  "header-bit",
  "data-bit",
  "offset-swap",
  "dtype-relabel",
  "shape-edit",
  "json-number",
  "json-drop-key",
  "json-type",
  "json-break",
  "rename",
  "metadata-edit",
  "metadata-drop",
  "truncate",
  "append",
  "whitespace",
  "key-order",
] as const;

/**
 * `count` mutants of the safetensors file `bytes`, a pure function of
 * (`bytes`, `seed`): kinds in turn (those that apply to this file), details
 * drawn from a counter-based hash. Every mutant except the `neutral` ones
 * changes something a loader must notice: a bit, the layout, a dtype, a
 * shape, a name, the metadata, the length.
 *
 * @param bytes A valid safetensors file.
 * @param seed Any non-negative integer.
 * @param count How many mutants.
 * @returns The mutants, lazily.
 */
export function* mutations(bytes: Uint8Array, seed: number, count: number): Iterable<Mutant> {
  const { header, data } = splitFile(bytes);
  const names = tensorNames(header);
  const nonEmpty = names.filter((n) => {
    const [b, e] = info(header, n).data_offsets;
    return e > b;
  });
  const sameSize = names.flatMap((a) =>
    names.filter((b) => {
      const [a0, a1] = info(header, a).data_offsets, [b0, b1] = info(header, b).data_offsets;
      return a < b && a1 - a0 === b1 - b0;
    }).map((b) => [a, b] as const)
  );
  const metadata = (header.__metadata__ ?? {}) as Record<string, string>;
  const applies: Record<(typeof MUTATION_KINDS)[number], boolean> = {
    "length-bit": true,
    "header-bit": true,
    "data-bit": data.byteLength > 0,
    "offset-swap": sameSize.length > 0,
    "dtype-relabel": names.some((n) => Object.hasOwn(RELABEL, info(header, n).dtype)),
    "shape-edit": names.length > 0,
    "json-number": names.length > 0,
    "json-drop-key": names.length > 0,
    "json-type": true,
    "json-break": true,
    "rename": names.length > 0,
    "metadata-edit": Object.keys(metadata).length > 0,
    "metadata-drop": Object.keys(metadata).length > 0,
    "truncate": true,
    "append": true,
    "whitespace": true,
    "key-order": Object.keys(header).length > 1,
  };
  const kinds = MUTATION_KINDS.filter((k) => applies[k]);
  const headerLength = bytes.byteLength - data.byteLength - 8;
  for (let i = 0; i < count; i++) {
    const dice = new Dice((seed * 7919 + i) >>> 0);
    const kind = kinds[i % kinds.length];
    const h = structuredClone(header);
    const edited = (what: string, neutral = false): Mutant => ({
      kind,
      detail: what,
      bytes: joinFile(h, data),
      neutral,
    });
    switch (kind) {
      case "length-bit": {
        const out = bytes.slice(), bit = dice.below(64);
        out[bit >> 3] ^= 1 << (bit & 7);
        yield { kind, detail: `bit ${bit} of the header length`, bytes: out, neutral: false };
        break;
      }
      case "header-bit": {
        const out = bytes.slice(), at = 8 + dice.below(headerLength), bit = dice.below(8);
        out[at] ^= 1 << bit;
        // Flipping a padding space into another blank-free byte breaks the JSON; a flip
        // that leaves JSON the same is impossible (every byte of compact JSON matters).
        yield { kind, detail: `bit ${bit} of header byte ${at}`, bytes: out, neutral: false };
        break;
      }
      case "data-bit": {
        const out = bytes.slice(), at = dice.below(data.byteLength), bit = dice.below(8);
        out[8 + headerLength + at] ^= 1 << bit;
        const hit = nonEmpty.find((n) => {
          const [b, e] = info(header, n).data_offsets;
          return at >= b && at < e;
        });
        yield {
          kind,
          detail: `bit ${bit} of data byte ${at} (${hit})`,
          bytes: out,
          neutral: false,
        };
        break;
      }
      case "offset-swap": {
        const [a, b] = dice.pick(sameSize);
        const ia = info(h, a), ib = info(h, b);
        [ia.data_offsets, ib.data_offsets] = [ib.data_offsets, ia.data_offsets];
        // Two tensors with the same bytes (a fresh BatchNorm's bias and running mean) swap
        // to the same file contents: nothing a loader could or should notice.
        const same = data.subarray(...ia.data_offsets).every((v, j) =>
          v === data[ib.data_offsets[0] + j]
        );
        yield edited(`${a} <-> ${b}${same ? " (same bytes)" : ""}`, same);
        break;
      }
      case "dtype-relabel": {
        const name = dice.pick(names.filter((n) => Object.hasOwn(RELABEL, info(h, n).dtype)));
        const t = info(h, name), was = t.dtype;
        t.dtype = dice.pick(RELABEL[was]);
        yield edited(`${name}: ${was} -> ${t.dtype}`);
        break;
      }
      case "shape-edit": {
        const name = dice.pick(names), t = info(h, name), was = JSON.stringify(t.shape);
        const size = t.shape.reduce((a, b) => a * b, 1);
        const edits = [
          () => t.shape.reverse(), // same size (a transpose's shape)
          () => t.shape.push(1), // same size, one more axis
          () => (t.shape = [size]), // flattened
          () => t.shape.length > 0 && t.shape.pop(),
          () => (t.shape = t.shape.map((d) => d + 1)),
        ];
        dice.pick(edits)();
        if (JSON.stringify(t.shape) === was) t.shape = [...t.shape, 2];
        yield edited(`${name}: ${was} -> ${JSON.stringify(t.shape)}`);
        break;
      }
      case "json-number": {
        const name = dice.pick(names), t = info(h, name);
        const field = dice.pick(["shape", "data_offsets"] as const);
        const values = t[field] as number[];
        if (values.length === 0) {
          t.shape = [1];
          yield edited(`${name}: shape [] -> [1]`);
          break;
        }
        const at = dice.below(values.length), was = values[at];
        values[at] = dice.pick([was + 1, was - 1, 0, was * 2 + 1, -1, 1.5, 2 ** 53, 1e300]);
        if (values[at] === was) values[at] = was + 1;
        yield edited(`${name}.${field}[${at}]: ${was} -> ${values[at]}`);
        break;
      }
      case "json-drop-key": {
        const name = dice.pick(names);
        const field = dice.pick([null, "dtype", "shape", "data_offsets"]);
        if (field === null) delete h[name];
        else delete (h[name] as Record<string, unknown>)[field];
        yield edited(`dropped ${name}${field ? `.${field}` : ""}`);
        break;
      }
      case "json-type": {
        const { parent, key } = pickSlot(dice, h);
        const was = JSON.stringify(parent[key]);
        parent[key] = otherValue(dice, parent[key]);
        if (JSON.stringify(parent[key]) === was) parent[key] = "changed";
        yield edited(`${key}: ${was?.slice(0, 40)} -> ${JSON.stringify(parent[key])}`);
        break;
      }
      case "json-break": {
        const text = JSON.stringify(header);
        const at = dice.below(text.length);
        const broken = dice.pick([
          text.slice(0, at), // cut short
          text.slice(0, at) + dice.pick(["}", "]", ",", '"', ":", "{", "\\"]) + text.slice(at),
          text.slice(0, at) + text.slice(at + 1), // one character dropped
        ]);
        if (broken === text) break;
        yield { kind, detail: `at ${at}`, bytes: joinFile(broken, data), neutral: false };
        break;
      }
      case "rename": {
        const name = dice.pick(names),
          renamed = dice.pick([`${name}x`, `x.${name}`, "", "a".repeat(5000)]);
        if (renamed in h) break;
        h[renamed] = h[name];
        delete h[name];
        yield edited(`${name} -> ${renamed.slice(0, 40)}`);
        break;
      }
      case "metadata-edit": {
        const m = h.__metadata__ as Record<string, string>;
        const key = dice.pick(Object.keys(m));
        const { text, what } = editJsonText(dice, m[key]);
        m[key] = text === m[key] ? `${text} ` : text;
        yield edited(`metadata ${key}: ${what}`);
        break;
      }
      case "metadata-drop": {
        const m = h.__metadata__ as Record<string, string>;
        const key = dice.pick([...Object.keys(m), null]);
        if (key === null) delete h.__metadata__;
        else delete m[key];
        yield edited(key === null ? "dropped __metadata__" : `dropped metadata ${key}`);
        break;
      }
      case "truncate": {
        const at = dice.below(bytes.byteLength);
        yield { kind, detail: `cut at ${at}`, bytes: bytes.slice(0, at), neutral: false };
        break;
      }
      case "append": {
        const extra = new Uint8Array(1 + dice.below(16)).map(() => dice.below(256));
        const out = new Uint8Array([...bytes, ...extra]);
        yield { kind, detail: `${extra.length} bytes`, bytes: out, neutral: false };
        break;
      }
      case "whitespace": {
        const text = JSON.stringify(header, null, dice.pick([1, 2, "\t"]));
        yield { kind, detail: "pretty-printed", bytes: joinFile(text, data), neutral: true };
        break;
      }
      case "key-order": {
        const keys = Object.keys(header).reverse();
        const reordered: Header = {};
        for (const k of keys) {
          Object.defineProperty(reordered, k, { value: header[k], enumerable: true });
        }
        yield { kind, detail: "keys reversed", bytes: joinFile(reordered, data), neutral: true };
        break;
      }
    }
  }
}

/** The file without halfstep's checksums (as an older halfstep or another writer would save it). */
export function withoutChecksums(bytes: Uint8Array): Uint8Array {
  return rewriteHeader(bytes, (h) => {
    const m = h.__metadata__ as Record<string, string> | undefined;
    if (m) delete m["halfstep.checksums"];
    if (m && Object.keys(m).length === 0) delete h.__metadata__;
  });
}
