import assert from "node:assert/strict";
import { Tensor } from "../../gpu/mod.ts";
import {
  decodeSafetensors,
  encodeSafetensors,
  entryToTensor,
  type SafetensorsEntry,
  SafetensorsError,
  tensorToEntry,
} from "../../nn/safetensors.ts";
import { loadSafetensors, saveSafetensors } from "../../nn/safetensors_file.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { rewriteHeader } from "../helpers/file_mutations.ts";

// Expected bytes below come from host typed arrays; the format is little-endian.
assert.equal(new Uint8Array(new Uint16Array([1]).buffer)[0], 1, "these tests assume a LE host");

const bytesOf = (a: Float32Array | Float16Array | Int32Array): Uint8Array =>
  new Uint8Array(a.buffer.slice(a.byteOffset, a.byteOffset + a.byteLength));
/** 16-bit patterns (f16, bf16) as little-endian bytes (NaN payloads that no number conversion keeps). */
const f16Bits = (bits: number[]): Uint8Array => new Uint8Array(new Uint16Array(bits).buffer);

interface Case {
  name: string;
  make: () => Tensor;
  expected: SafetensorsEntry;
}

/** A state of odd shapes and awkward values; `expected` is built without our module. */
function stateCases(): Case[] {
  const f32 = [0, -0, 1.5, -1e-45, 3.4028234663852886e38, Infinity, -Infinity, NaN, 1 / 3];
  const f32Big = Array.from({ length: 15 }, (_, i) => f32[i % f32.length] * (i + 1));
  const f16 = [1, -2, 65504, 6e-8, -0, 0.333, 1000];
  const ids = [0, -1, 2147483647, -2147483648, 16777217]; // 2^24 + 1 is not exact in f32
  const f16Raw = [0x3c00, 0x7e01, 0xfd55, 0x7c00, 0xfc00, 0x8000, 0x0001, 0x03ff, 0x7bff];
  const from = (name: string, v: number[], shape: number[], dtype: "f32" | "f16" | "i32") => ({
    name,
    make: () => Tensor.from(v, shape, { dtype }),
    expected: {
      dtype,
      shape,
      data: bytesOf(
        dtype === "f32"
          ? Float32Array.from(v)
          : dtype === "f16"
          ? Float16Array.from(v)
          : Int32Array.from(v),
      ),
    },
  });
  const raw: SafetensorsEntry = { dtype: "f16", shape: [3, 3], data: f16Bits(f16Raw) };
  // bf16: 1, a NaN payload, a negative NaN, ±Inf, −0, the smallest subnormal (odd count).
  const bf16Raw = [0x3f80, 0x7f81, 0xffc3, 0x7f80, 0xff80, 0x8000, 0x0001];
  const rawBf16: SafetensorsEntry = { dtype: "bf16", shape: [7], data: f16Bits(bf16Raw) };
  // Values already bf16 (8 significant bits), so Tensor.from keeps them exactly.
  const bf16 = [1, -2, 0.375, 3.3895313892515355e38, -1.1754943508222875e-38];
  return [
    from("layer.0.weight", f32Big, [3, 5], "f32"),
    from("layer.0.bias", f16, [7], "f16"), // odd count: the GPU buffer is padded
    from("embed.ids", ids, [5], "i32"),
    from("scalar", [2.5], [], "f32"),
    from("empty", [], [0], "f32"),
    from("empty_ids", [], [0, 3], "i32"),
    from("cube", [1, 2, 3, 4, 5, 6], [2, 1, 3], "f16"),
    { name: "nan_payloads", make: () => entryToTensor(raw), expected: raw },
    { name: "bf16_bits", make: () => entryToTensor(rawBf16), expected: rawBf16 },
    {
      name: "weights.bf16",
      make: () => Tensor.from(bf16, [5], { dtype: "bf16" }),
      expected: {
        dtype: "bf16",
        shape: [5],
        data: f16Bits(bf16.map((v) => new Uint32Array(new Float32Array([v]).buffer)[0] >>> 16)),
      },
    },
  ];
}

function assertSameEntry(
  actual: SafetensorsEntry | undefined,
  expected: SafetensorsEntry,
  what: string,
) {
  assert.ok(actual, `${what} is missing`);
  assert.equal(actual.dtype, expected.dtype, `${what} dtype`);
  assert.deepEqual(actual.shape, expected.shape, `${what} shape`);
  assert.deepEqual([...actual.data], [...expected.data], `${what} bytes`);
}

/** An independent minimal reader of the published layout (does not use our decoder). */
function parseByHand(file: Uint8Array) {
  const n = Number(new DataView(file.buffer, file.byteOffset).getBigUint64(0, true));
  const text = new TextDecoder().decode(file.subarray(8, 8 + n));
  return { n, text, header: JSON.parse(text), data: file.subarray(8 + n) };
}

/** A file in the published layout with a hand-made header (no encoder involved). */
function fileByHand(header: unknown, data: Uint8Array, pad = true): Uint8Array {
  let json = typeof header === "string" ? header : JSON.stringify(header);
  if (pad) json += " ".repeat((8 - (json.length % 8)) % 8);
  const text = new TextEncoder().encode(json);
  const file = new Uint8Array(8 + text.length + data.length);
  new DataView(file.buffer).setBigUint64(0, BigInt(text.length), true);
  file.set(text, 8);
  file.set(data, 8 + text.length);
  return file;
}

const metadata = { format: "pt", step: "7" };

/** CRC-32C one bit at a time, straight from its definition (reflected polynomial 0x82F63B78). */
function bitwiseCrc32c(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const byte of bytes) {
    crc ^= byte;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0x82f63b78 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

Deno.test("safetensors: a state round-trips through a file bit-exactly", GPU_TEST, async () => {
  const dir = await Deno.makeTempDir();
  const cases = stateCases();
  const state = Object.fromEntries(cases.map((c) => [c.name, c.make()]));
  try {
    await saveSafetensors(`${dir}/a.safetensors`, state, { metadata, allowNonFinite: true });
    const loaded = await loadSafetensors(`${dir}/a.safetensors`);
    assert.deepEqual(loaded.metadata, metadata);
    assert.deepEqual([...loaded.entries.keys()].sort(), cases.map((c) => c.name).sort());
    for (const c of cases) assertSameEntry(loaded.entries.get(c.name), c.expected, c.name);

    // Back onto the GPU and out again: still the same bits; re-saving gives the same file.
    const again = new Map([...loaded.entries].map(([k, e]) => [k, entryToTensor(e)]));
    for (const c of cases) {
      assertSameEntry(await tensorToEntry(again.get(c.name)!), c.expected, c.name);
    }
    await saveSafetensors(`${dir}/b.safetensors`, again, { metadata, allowNonFinite: true });
    assert.deepEqual(
      await Deno.readFile(`${dir}/b.safetensors`),
      await Deno.readFile(`${dir}/a.safetensors`),
    );
    // read() of an i32 tensor is exact (an Int32Array), 2^24 + 1 included.
    assert.deepEqual([...(await again.get("embed.ids")!.read())], [
      0,
      -1,
      2147483647,
      -2147483648,
      16777217,
    ]);
    for (const t of again.values()) t.dispose();
  } finally {
    for (const t of Object.values(state)) t.dispose();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("safetensors: the file follows the published layout", GPU_TEST, async () => {
  const cases = stateCases();
  const tensors = new Map(cases.map((c) => [c.name, c.make()]));
  const dir = await Deno.makeTempDir();
  try {
    await saveSafetensors(`${dir}/m.safetensors`, tensors, { metadata, allowNonFinite: true });
    const file = await Deno.readFile(`${dir}/m.safetensors`);
    const { n, text, header, data } = parseByHand(file);
    assert.equal(n % 8, 0, "header length is a multiple of 8");
    assert.match(text, /^\{.*\} {0,7}$/s, "JSON object padded with fewer than 8 spaces");
    assert.equal(text.trimEnd(), JSON.stringify(header), "compact JSON, as serde_json writes");
    const { __metadata__: meta, ...infos } = header;
    const { "halfstep.checksums": sums, ...userMetadata } = meta;
    assert.deepEqual(userMetadata, metadata);
    // One CRC-32C per tensor over JSON [name, dtype, shape] then its bytes, and one over
    // the sorted metadata entries, as 8 hex digits; checked against a bit-at-a-time CRC.
    const checksums = JSON.parse(sums);
    assert.deepEqual(
      Object.keys(checksums).sort(),
      ["__metadata__", ...cases.map((c) => c.name)].sort(),
    );
    const w = infos["layer.0.weight"];
    const described = new TextEncoder().encode(JSON.stringify(["layer.0.weight", "F32", [3, 5]]));
    const covered = new Uint8Array([...described, ...data.subarray(...w.data_offsets)]);
    assert.equal(checksums["layer.0.weight"], bitwiseCrc32c(covered).toString(16).padStart(8, "0"));
    const metadataText = JSON.stringify(Object.entries(metadata).sort());
    assert.equal(
      checksums.__metadata__,
      bitwiseCrc32c(new TextEncoder().encode(metadataText)).toString(16).padStart(8, "0"),
    );
    assert.equal(Object.keys(header)[0], "__metadata__");
    const sizes: Record<string, number> = { F32: 4, F16: 2, BF16: 2, I32: 4 };
    let cursor = 0;
    // The reference order: keys in data order, f32, i32, bf16, f16 (the reverse of the format's
    // dtype enum), then by name.
    type Info = { dtype: string; shape: number[]; data_offsets: number[] };
    for (const [name, info] of Object.entries(infos) as [string, Info][]) {
      const c = cases.find((c) => c.name === name)!;
      assert.equal(info.dtype, c.expected.dtype.toUpperCase(), name);
      assert.deepEqual(info.shape, c.expected.shape, name);
      const [begin, end] = info.data_offsets;
      assert.equal(begin, cursor, `${name} starts where the previous tensor ended`);
      assert.equal(begin % sizes[info.dtype], 0, `${name} is aligned`);
      assert.deepEqual([...data.subarray(begin, end)], [...c.expected.data], name);
      cursor = end;
    }
    assert.equal(cursor, data.length, "the tensors cover the data buffer exactly");
    assert.deepEqual(Object.keys(infos), [
      "empty",
      "layer.0.weight",
      "scalar",
      "embed.ids",
      "empty_ids",
      "bf16_bits",
      "weights.bf16",
      "cube",
      "layer.0.bias",
      "nan_payloads",
    ]);
  } finally {
    for (const t of tensors.values()) t.dispose();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("safetensors: encoder output matches the reference byte for byte", () => {
  // Header lengths from the reference implementation's own unit tests:
  // 64 (no padding needed), 72 (7 spaces of padding), 8 ("{}" + 6 spaces).
  const data = bytesOf(Float32Array.from([0, 1, 2, 3, 4, 5]));
  for (
    const [name, shape, n] of [["attn.0", [1, 2, 3], 64], ["attn0", [1, 1, 2, 3], 72]] as const
  ) {
    const want = fileByHand({ [name]: { dtype: "F32", shape, data_offsets: [0, 24] } }, data);
    assert.equal(parseByHand(want).n, n);
    const got = encodeSafetensors(new Map([[name, { dtype: "f32", shape: [...shape], data }]]), {
      checksums: false,
    });
    assert.deepEqual([...got], [...want]);
  }
  assert.deepEqual(
    [...encodeSafetensors(new Map(), { checksums: false })],
    [...fileByHand("{}", new Uint8Array())],
  );
  assert.deepEqual(
    [...encodeSafetensors(new Map(), { metadata: { framework: "pt" }, checksums: false })],
    [...fileByHand({ __metadata__: { framework: "pt" } }, new Uint8Array())],
  );
});

Deno.test("safetensors: a file written by hand (like PyTorch's) decodes", GPU_TEST, async () => {
  const weight = [1, -2, 0.5, 3, 4.25, -0];
  const dv = new DataView(new ArrayBuffer(30));
  weight.forEach((v, i) => dv.setFloat32(4 * i, v, true));
  [0x3c00, 0xc000, 0x3800].forEach((b, i) => dv.setUint16(24 + 2 * i, b, true)); // 1, -2, 0.5
  const header = '{"__metadata__":{"format":"pt"},' +
    '"weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},' +
    '"bias":{"dtype":"F16","shape":[3],"data_offsets":[24,30]}}';
  const file = fileByHand(header, new Uint8Array(dv.buffer));
  const { entries, metadata } = decodeSafetensors(file);
  assert.deepEqual(metadata, { format: "pt" });
  assert.deepEqual([...entries.keys()].sort(), ["bias", "weight"]);
  const w = entryToTensor(entries.get("weight")!), b = entryToTensor(entries.get("bias")!);
  assert.deepEqual([...w.shape, ...b.shape], [2, 3, 3]);
  assert.deepEqual([...(await w.read())], weight);
  assert.ok(Object.is((await w.read())[5], -0));
  assert.deepEqual([...(await b.read())], [1, -2, 0.5]);
  w.dispose();
  b.dispose();
  // Our encoder writes the same file back (one metadata key, so no order question).
  assert.deepEqual([...encodeSafetensors(entries, { metadata, checksums: false })], [...file]);
  // Other writers: keys in any order, pretty-printed JSON, no padding.
  const pretty = JSON.stringify(
    {
      b: { dtype: "I32", shape: [1], data_offsets: [4, 8] },
      a: { dtype: "I32", shape: [], data_offsets: [0, 4] },
    },
    null,
    2,
  );
  const other = decodeSafetensors(fileByHand(pretty, bytesOf(Int32Array.from([7, -9])), false));
  assert.deepEqual([...other.entries.get("b")!.data], [...bytesOf(Int32Array.from([-9]))]);
  assert.deepEqual(other.metadata, {});
});

Deno.test("safetensors: truncated and corrupt files are rejected with clear errors", async () => {
  const f32 = (n: number) => new Uint8Array(4 * n);
  const good = encodeSafetensors(
    new Map<string, SafetensorsEntry>([
      ["w", { dtype: "f32", shape: [2, 2], data: f32(4) }],
      ["b", { dtype: "f16", shape: [3], data: new Uint8Array(6) }],
    ]),
  );
  const n = parseByHand(good).n;
  const rejects = (bytes: Uint8Array, pattern: RegExp) =>
    assert.throws(() => decodeSafetensors(bytes), (err: Error) => {
      assert.ok(err instanceof SafetensorsError, `${err}`);
      assert.match(err.message, pattern);
      return true;
    });
  rejects(good.subarray(0, 5), /5 bytes, shorter than the 8-byte header length/);
  rejects(good.subarray(0, 8 + n - 3), /truncated: the header needs \d+ bytes/);
  rejects(
    good.subarray(0, good.length - 3),
    /truncated: tensor "b" ends at data byte 22 of 19/,
  );
  rejects(new Uint8Array([...good, 0]), /1 unused bytes after the last tensor/);
  const corrupt = good.slice();
  corrupt[8] = 0x23; // "#" for "{"
  rejects(corrupt, /not valid UTF-8 JSON/);
  corrupt[8] = 0xff;
  rejects(corrupt, /not valid UTF-8 JSON/);
  const huge = good.slice();
  new DataView(huge.buffer).setBigUint64(0, 1n << 62n, true);
  rejects(huge, /header length \d+ exceeds 100 MB/);
  rejects(fileByHand("[]", new Uint8Array()), /must be a JSON object/);

  const i64 = (v: bigint[]) => new Uint8Array(new BigInt64Array(v).buffer);
  const one = (info: Record<string, unknown>, data = f32(3)) =>
    fileByHand({ t: { dtype: "F32", shape: [3], data_offsets: [0, 12], ...info } }, data);
  rejects(one({ dtype: "F99" }), /Tensor "t": unknown dtype "F99"/);
  rejects(one({ dtype: "toString" }), /Tensor "t": unknown dtype "toString"/);
  rejects(one({ dtype: "F64" }), /Tensor "t": dtype F64 is not supported/);
  rejects(
    one({ dtype: "I64", shape: [1], data_offsets: [0, 8] }, i64([2n ** 31n])),
    /Tensor "t": I64 value 2147483648 does not fit the i32 it loads into/,
  );
  rejects(one({ dtype: undefined }), /Tensor "t": dtype .* is missing/);
  for (const shape of [[-1], [1.5], "3", [null]]) {
    rejects(one({ shape }), /Tensor "t": shape .* must be an array of non-negative integers/);
  }
  rejects(one({ data_offsets: [0, 8] }), /"t": data_offsets \[0, 8\] span 8 bytes .* needs 12/);
  rejects(one({ data_offsets: [4, 16] }, f32(4)), /hole of 4 bytes before tensor "t"/);
  // The smallest hole, one byte: offsets one off from the data they describe.
  rejects(one({ data_offsets: [1, 13] }, new Uint8Array(13)), /hole of 1 bytes before tensor "t"/);
  rejects(one({ data_offsets: [0] }), /"t": data_offsets \[0\] must be \[begin, end\]/);
  rejects(one({ data_offsets: [0, 12] }, f32(2)), /truncated: tensor "t" ends at data byte 12/);
  const two = (bBegin: number, data: Uint8Array) =>
    fileByHand({
      a: { dtype: "F32", shape: [3], data_offsets: [0, 12] },
      b: { dtype: "F32", shape: [3], data_offsets: [bBegin, bBegin + 12] },
    }, data);
  rejects(two(8, f32(5)), /Tensor "b" \[8, 20\) overlaps tensor "a"/);
  rejects(two(16, f32(7)), /hole of 4 bytes before tensor "b"/);
  rejects(two(13, new Uint8Array(25)), /hole of 1 bytes before tensor "b"/);
  rejects(fileByHand({ __metadata__: { step: 1 } }, new Uint8Array()), /"__metadata__" must be/);
  // A 10 MB name or value is cut, never echoed whole.
  const hugeName = "n".repeat(10_000_000);
  for (
    const [pattern, file] of [
      [/Tensor "t": unknown dtype "F{79}…"/, one({ dtype: "F".repeat(10_000_000) })],
      [
        /Tensor "n{79}…": dtype F64/,
        fileByHand({ [hugeName]: { dtype: "F64", shape: [] } }, f32(1)),
      ],
      [/shape \[1,1,1,.*…/, one({ shape: Array(1_000_000).fill(1).concat(-1) })],
    ] as const
  ) {
    assert.throws(() => decodeSafetensors(file), (err: Error) => {
      assert.match(err.message, pattern);
      return err.message.length < 300;
    });
  }

  // The encoder and entryToTensor check entries too.
  assert.throws(
    () => encodeSafetensors(new Map([["w", { dtype: "f32", shape: [3], data: f32(2) }]])),
    /tensor "w": a f32 tensor \[3\] needs 12 bytes of data but has 8/,
  );
  assert.throws(
    () => encodeSafetensors(new Map([["__metadata__", { dtype: "f32", shape: [], data: f32(1) }]])),
    /reserved/,
  );
  assert.throws(() => entryToTensor({ dtype: "i32", shape: [2], data: f32(1) }), /needs 8 bytes/);

  // Through the file API: the error names the path.
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeFile(`${dir}/cut.safetensors`, good.subarray(0, 30));
    await assert.rejects(loadSafetensors(`${dir}/cut.safetensors`), (err: Error) => {
      assert.ok(err instanceof SafetensorsError);
      assert.match(err.message, /cut\.safetensors" is not a valid safetensors file: .*truncated/);
      return true;
    });
    await assert.rejects(loadSafetensors(`${dir}/missing.safetensors`), (err: Error) => {
      assert.ok(err instanceof Deno.errors.NotFound);
      assert.match(err.message, /cannot read ".*missing\.safetensors"/);
      return true;
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test(
  "safetensors: a failed save leaves the previous file untouched and no temp file",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    const path = `${dir}/model.safetensors`;
    const a = Tensor.from([1, 2, 3], [3]);
    const b = Tensor.from([4, 5], [2]);
    const listing = async () =>
      (await Array.fromAsync(Deno.readDir(dir))).map((e) => e.name).sort();
    try {
      await saveSafetensors(path, { a }, { metadata: { step: "1" } });
      const before = await Deno.readFile(path);

      // Reading "z" back fails after "a" was read: nothing reaches the disk.
      const z = Tensor.from([9], [1]);
      z.dispose();
      await assert.rejects(saveSafetensors(path, { a, z }), (err: Error) => {
        assert.match(err.message, /cannot write ".*model\.safetensors" \(left unchanged\)/);
        assert.match(err.message, /disposed/);
        return true;
      });
      assert.deepEqual(await Deno.readFile(path), before);
      assert.deepEqual(await listing(), ["model.safetensors"]);

      // Invalid metadata fails before anything touches the disk.
      await assert.rejects(
        saveSafetensors(path, { a }, { metadata: { step: 2 as unknown as string } }),
        /metadata "step" must be a string/,
      );
      assert.deepEqual(await Deno.readFile(path), before);
      assert.deepEqual(await listing(), ["model.safetensors"]);

      // A missing directory: a clear error naming the path, nothing created.
      await assert.rejects(
        saveSafetensors(`${dir}/no/such/dir/m.safetensors`, { a }),
        Deno.errors.NotFound,
      );

      // A successful save replaces the file atomically and leaves no temp file.
      await saveSafetensors(path, { a, b }, { metadata: { step: "2" } });
      const { entries, metadata } = await loadSafetensors(path);
      assert.deepEqual(metadata, { step: "2" });
      assert.deepEqual([...entries.keys()], ["a", "b"]);
      assert.deepEqual(await listing(), ["model.safetensors"]);
    } finally {
      a.dispose();
      b.dispose();
      await Deno.remove(dir, { recursive: true });
    }
  },
);

Deno.test("decodeSafetensors: BF16 loads as bf16 with its bits, I64 narrows to i32, exactly", () => {
  // bf16 bit patterns: 1, −2, the largest finite, the smallest subnormal, −0, +Inf, a NaN.
  const bf16 = [0x3f80, 0xc000, 0x7f7f, 0x0001, 0x8000, 0x7f80, 0x7fc1];
  const ids = [0n, -1n, 3n, 2n ** 31n - 1n, -(2n ** 31n)];
  const file = fileByHand({
    b: { dtype: "BF16", shape: [7], data_offsets: [0, 14] },
    n: { dtype: "I64", shape: [5], data_offsets: [16, 56] },
    pad: { dtype: "F16", shape: [1], data_offsets: [14, 16] },
  }, new Uint8Array([...f16Bits(bf16), 0, 0, ...new Uint8Array(new BigInt64Array(ids).buffer)]));
  const { entries } = decodeSafetensors(file);
  const b = entries.get("b")!;
  assert.deepEqual([b.dtype, b.shape], ["bf16", [7]]);
  assert.deepEqual([...b.data], [...f16Bits(bf16)], "the file's bytes");
  const n = entries.get("n")!;
  assert.deepEqual([n.dtype, n.shape], ["i32", [5]]);
  assert.deepEqual(Array.from(new Int32Array(n.data.slice().buffer)), ids.map(Number));
});

Deno.test(
  "safetensors: checksums catch a flipped data bit, swapped offsets, a relabelled " +
    "dtype and edited metadata, naming the tensor; files without them still load",
  async () => {
    const f16 = (values: number[]) => bytesOf(Float16Array.from(values));
    const entries = new Map<string, SafetensorsEntry>([
      ["norm.weight", { dtype: "f16", shape: [4], data: f16([1, 2, 3, 4]) }],
      ["norm.bias", { dtype: "f16", shape: [4], data: f16([5, 6, 7, 8]) }],
      ["fc.weight", {
        dtype: "f32",
        shape: [2, 3],
        data: bytesOf(Float32Array.of(1, 2, 3, 4, 5, 6)),
      }],
    ]);
    const good = encodeSafetensors(entries, { metadata: { step: "7", lr: "0.001" } });
    const decoded = decodeSafetensors(good);
    assert.deepEqual(
      decoded.metadata,
      { step: "7", lr: "0.001" },
      "checksums are not user metadata",
    );
    const rejects = (bytes: Uint8Array, pattern: RegExp) =>
      assert.throws(() => decodeSafetensors(bytes), (err: Error) => {
        assert.ok(err instanceof SafetensorsError, `${err}`);
        assert.match(err.message, pattern);
        assert.ok(!err.message.includes("\n") && err.message.length < 300, err.message);
        return true;
      });
    // One exponent bit of fc.weight's last value (f32 data comes first in the file).
    const { n } = parseByHand(good);
    const flipped = good.slice();
    flipped[8 + n + 23] ^= 0x40;
    rejects(flipped, /Tensor "fc\.weight": checksum mismatch/);
    const swapped = rewriteHeader(good, (h) => {
      const w = h["norm.weight"] as { data_offsets: number[] };
      const b = h["norm.bias"] as { data_offsets: number[] };
      [w.data_offsets, b.data_offsets] = [b.data_offsets, w.data_offsets];
    });
    rejects(swapped, /Tensor "norm\.(weight|bias)": checksum mismatch/);
    const relabelled = rewriteHeader(good, (h) => {
      (h["norm.bias"] as { dtype: string }).dtype = "BF16";
    });
    rejects(relabelled, /Tensor "norm\.bias": checksum mismatch/);
    const edited = rewriteHeader(good, (h) => {
      (h.__metadata__ as Record<string, string>).lr = "0.01";
    });
    rejects(edited, /The metadata: checksum mismatch/);
    const added = rewriteHeader(good, (h) => {
      (h.__metadata__ as Record<string, string>).extra = "1";
    });
    rejects(added, /The metadata: checksum mismatch/);
    // Saving refuses the reserved key; files without checksums (PyTorch's) load.
    assert.throws(
      () => encodeSafetensors(new Map(), { metadata: { "halfstep.checksums": "{}" } }),
      /metadata key "halfstep\.checksums" is reserved/,
    );
    const torch = await Deno.readFile(
      new URL("../fixtures/torch/state_f16.safetensors", import.meta.url),
    );
    assert.ok(!new TextDecoder().decode(torch).includes("halfstep.checksums"));
    assert.ok(decodeSafetensors(torch).entries.size > 0);
  },
);
