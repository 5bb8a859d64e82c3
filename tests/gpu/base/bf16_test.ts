/**
 * bf16 storage: rounding from f32 bit for bit against a reference written
 * here from the definition (the two bf16 neighbours as f64 values, the
 * nearer one, ties to even, Inf past the largest finite), on the host, on the
 * GPU (one tensor of odd length written by many threads) and against
 * PyTorch; exact reads; casts among f32, f16 and bf16; and view ops moving
 * bits exactly at odd shapes and offsets.
 */
import assert from "node:assert/strict";
import {
  add,
  bf16FromF32,
  cast,
  dropout,
  embedding,
  flatten,
  initGpu,
  narrow,
  permute,
  RandomGenerator,
  reshape,
  split,
  sum,
  Tensor,
  tidy,
} from "../../../gpu/mod.ts";
import { launchReduce } from "../../helpers/internals.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { rng } from "../../helpers/reference.ts";
import { runTorch } from "../../helpers/torch.ts";

/** The largest finite bf16: (2 − 2⁻⁷)·2¹²⁷. */
const BF16_MAX = (2 - 2 ** -7) * 2 ** 127;

/** The f32 value of the bits `bits` (an encoding, no rounding). */
function f32Of(bits: number): number {
  return new Float32Array(new Uint32Array([bits]).buffer)[0];
}

/** The bits of a value that is exactly a bf16 (an encoding: its low 16 f32 bits are zero). */
function bitsOfExact(v: number): number {
  const word = new Uint32Array(new Float32Array([v]).buffer)[0];
  assert.equal(word & 0xffff, 0, `${v} is not a bf16 value`);
  return word >>> 16;
}

/**
 * The bf16 bits PyTorch gives an f32 value, from the values: NaN → 0x7FC0;
 * otherwise the bf16 neighbours below and above |v| (spaced 2^(e−7) for
 * 2^e ≤ |v| < 2^(e+1), e ≥ −126; 2⁻¹³³ among subnormals), the nearer one,
 * on a tie the one with an even significand, ±Inf past the largest finite.
 */
function bf16Reference(v: number): number {
  if (Number.isNaN(v)) return 0x7fc0;
  if (v === 0) return Object.is(v, -0) ? 0x8000 : 0;
  const sign = v < 0 ? -1 : 1, a = Math.abs(v);
  if (a === Infinity) return bitsOfExact(v);
  let e = Math.floor(Math.log2(a));
  while (2 ** e > a) e--;
  while (2 ** (e + 1) <= a) e++;
  const ulp = 2 ** (Math.max(e, -126) - 7);
  const q = a / ulp, below = Math.floor(q), frac = q - below;
  const k = frac > 0.5 || (frac === 0.5 && below % 2 === 1) ? below + 1 : below;
  const r = k * ulp;
  return bitsOfExact(sign * (r > BF16_MAX ? Infinity : r));
}

/** Hand-picked f32 bit patterns: ties, the largest finite values, overflow, NaNs, zeros, subnormals. */
const EDGES = [
  0x00000000,
  0x80000000, // ±0
  0x3f800000,
  0xbf800000, // ±1
  0x3f808000,
  0x3f818000, // ties: 0x3f80 even stays, 0x3f81 odd goes up
  0x3f808001,
  0x3f807fff,
  0xbf818000, // just above / below a tie; a negative tie
  0x7f7f0000,
  0x7f7f7fff, // the largest finite bf16; just under its half-ulp
  0x7f7f8000,
  0xff7f8000,
  0x7f7fffff,
  0xff7fffff, // ties and f32 max: round to ±Inf
  0x7f7e8000, // a tie below the max that stays finite (0x7f7e even)
  0x7f800000,
  0xff800000, // ±Inf
  0x7fc00000,
  0x7f800001,
  0x7fffffff,
  0x7f808000, // NaNs: quiet, signalling, payloads
  0xffc00000,
  0xff800001,
  0xffffffff, // negative NaNs → 0x7fc0 as well
  0x00000001,
  0x80000001,
  0x00008000,
  0x00018000,
  0x00008001, // subnormals, ties among them
  0x007f8000,
  0x807fffff,
  0x007fffff,
  0x00800000, // the largest subnormals round up to normal
  0x3effffff,
  0x4b7fffff,
  0x33800000,
  0x0d800001, // 1/2 − ulp, 2²⁴ − 1, 2⁻²⁴, tiny normal
];

/** `count` random f32 bit patterns (every exponent: zeros, subnormals, NaNs, ties included). */
function randomBits(count: number, seed: number): number[] {
  const random = rng(seed);
  const out = Array.from({ length: count }, () => Math.floor(random() * 2 ** 32));
  // Exact ties and near-ties are rare at random: force a quarter of them.
  for (let i = 0; i < count; i += 4) {
    out[i] = (out[i] & 0xffff0000) | [0x8000, 0x7fff, 0x8001][i % 3];
  }
  return out;
}

/** f32 bits as a little-endian f32 tensor (written as bytes: NaN payloads survive). */
function f32TensorOfBits(bits: readonly number[], shape = [bits.length]): Tensor {
  const t = Tensor.empty(shape, "f32");
  t.writeBytes(new Uint8Array(Uint32Array.from(bits).buffer));
  return t;
}

/** A bf16 tensor holding exactly `bits` (written as bytes: any payload). */
function bf16TensorOfBits(bits: readonly number[], shape = [bits.length]): Tensor {
  const t = Tensor.empty(shape, "bf16");
  t.writeBytes(new Uint8Array(Uint16Array.from(bits).buffer));
  return t;
}

/** The bf16 bits a tensor holds, through `read()` (whose f32 values are the bits shifted). */
async function bitsOf(t: Tensor): Promise<number[]> {
  assert.equal(t.dtype, "bf16");
  const values = await t.read() as Float32Array;
  return [...new Uint32Array(values.buffer, values.byteOffset, values.length)].map((w) => {
    assert.equal(w & 0xffff, 0, "read() widens: the low 16 bits are zero");
    return w >>> 16;
  });
}

/** A tensor-owning function: registers a tensor to dispose and returns it. */
type Own = <T extends Tensor>(t: T) => T;

/** Runs `fn`, then disposes every tensor it passed to `own` (tidy takes only synchronous code). */
async function owning(fn: (own: Own) => Promise<void>): Promise<void> {
  const made: Tensor[] = [];
  try {
    await fn((t) => (made.push(t), t));
  } finally {
    for (const t of made) t.dispose();
  }
}

const hex = (b: number) => `0x${b.toString(16).padStart(4, "0")}`;

/** Fails at the first element whose bits differ, naming its f32 input. */
function assertBits(
  actual: readonly number[],
  expected: readonly number[],
  inputs: readonly number[],
  what: string,
) {
  assert.equal(actual.length, expected.length, `${what}: length`);
  for (let i = 0; i < expected.length; i++) {
    if (actual[i] !== expected[i]) {
      assert.fail(
        `${what}: element ${i} (f32 bits 0x${inputs[i].toString(16)}) gave ${hex(actual[i])}, ` +
          `expected ${hex(expected[i])}`,
      );
    }
  }
}

Deno.test("bf16 reference: spot checks of the definition itself", () => {
  assert.equal(bf16Reference(1), 0x3f80);
  assert.equal(bf16Reference(f32Of(0x3f808000)), 0x3f80); // tie to even (down)
  assert.equal(bf16Reference(f32Of(0x3f818000)), 0x3f82); // tie to even (up)
  assert.equal(bf16Reference(f32Of(0x7f7f8000)), 0x7f80); // past the max: Inf
  assert.equal(bf16Reference(f32Of(0x00018000)), 0x0002); // a subnormal tie
  assert.equal(bf16Reference(-0), 0x8000);
  assert.equal(bf16Reference(NaN), 0x7fc0);
});

Deno.test({
  name: "bf16 on the host: Tensor.from and bf16FromF32 round every edge case and 20000 random " +
    "f32 bit patterns as the reference, read() returns the exact values",
  ...GPU_TEST,
  async fn() {
    const inputs = [...EDGES, ...randomBits(20001 - EDGES.length, 1)];
    const values = inputs.map(f32Of);
    const expected = values.map(bf16Reference);
    assertBits([...bf16FromF32(Float32Array.from(values))], expected, inputs, "bf16FromF32");
    // Odd length: the last word is half used.
    const t = Tensor.from(values, [values.length], { dtype: "bf16" });
    assert.equal(values.length % 2, 1);
    assertBits(await bitsOf(t), expected, inputs, "Tensor.from → read");
    // read() values are exactly the bf16 values, in f32.
    const read = await t.read();
    expected.forEach((b, i) => {
      const want = b === 0x7fc0 ? NaN : f32Of(b << 16);
      assert.ok(Object.is(read[i], want), `read()[${i}] is ${read[i]}, expected ${want}`);
    });
    t.dispose();
  },
});

Deno.test({
  name: "bf16 on the GPU: a cast of 4097 f32 values (edge cases, NaN payloads, random bits), " +
    "written by many threads, is the reference bit for bit; so are one-element stores from " +
    "neighbouring threads",
  ...GPU_TEST,
  async fn() {
    const inputs = [...EDGES, ...randomBits(4097 - EDGES.length, 2)];
    const expected = inputs.map((b) => bf16Reference(f32Of(b)));
    // A sum over an axis of 3 (exact in f32: small integers times a power of two) writes each
    // of 4097 outputs from its own thread; its bits are the reference of the exact sum.
    const random = rng(3);
    const scaled = Array.from(
      { length: 3 * 4097 },
      (_, i) => Math.floor(random() * 512 - 256) * 2 ** ((i % 4097) % 60 - 30),
    );
    const exact = Array.from(
      { length: 4097 },
      (_, i) => scaled[i] + scaled[4097 + i] + scaled[2 * 4097 + i],
    );
    await owning(async (own) => {
      const x = own(f32TensorOfBits(inputs));
      const bf16 = own(cast(x, "bf16"));
      const t = {
        cast: bf16,
        // A max over an axis of 1 stores each of the 4097 outputs from its own thread (st_):
        // neighbouring threads write the two halves of one word.
        single: own(
          Tensor.adopt(launchReduce("max", x, { outer: 1, axis: 1, inner: 4097 }, [4097], {
            out: "bf16",
          })),
        ),
        // Dropout with p = 0 (a word per thread) keeps every bf16 value.
        dropped: own(dropout(bf16, 0, new RandomGenerator(1).take(4097))),
        sums: own(sum(own(Tensor.from(scaled, [3, 4097], { dtype: "bf16" })), { axis: 0 })),
      };
      assertBits(await bitsOf(t.cast), expected, inputs, "cast f32 → bf16");
      // max and x·1 are arithmetic, which WGSL lets a GPU flush to zero for subnormals.
      const subnormal = (b: number) => (b & 0x7f80) === 0 && (b & 0x7f) !== 0;
      const flushed = (bits: number[]) =>
        bits.map((
          b,
          i,
        ) => (subnormal(expected[i]) && b === (expected[i] & 0x8000) ? expected[i] : b));
      assertBits(flushed(await bitsOf(t.single)), expected, inputs, "one-element stores (max)");
      assertBits(flushed(await bitsOf(t.dropped)), expected, inputs, "dropout p=0");
      const words = exact.map((v) => new Uint32Array(new Float32Array([v]).buffer)[0]);
      assertBits(await bitsOf(t.sums), exact.map(bf16Reference), words, "sum of 3 → bf16");
    });
  },
});

Deno.test({
  name:
    "bf16 agrees with PyTorch bit for bit (NaN as NaN): f32 → bf16 on the host and GPU, bf16 ↔ f16",
  ...GPU_TEST,
  async fn() {
    // f32 bits in; out: torch's bf16 bits of each, then f16 bits of those bf16 values, then
    // bf16 bits of f16 values (the f16 bits of the input's f16 rounding).
    const script = `
import sys, torch
bits = [int(s, 16) for s in sys.stdin.read().split()]
x = torch.tensor([b - (1 << 32) if b >= (1 << 31) else b for b in bits], dtype=torch.int32).view(torch.float32)
b = x.to(torch.bfloat16)
h = x.to(torch.float16)
for t in (b.view(torch.int16), b.to(torch.float16).view(torch.int16), h.to(torch.bfloat16).view(torch.int16), h.view(torch.int16)):
    print(" ".join(str(v & 0xffff) for v in t.tolist()))
`;
    const inputs = [...EDGES, ...randomBits(3001, 4)];
    const out = await runTorch(script, { stdin: inputs.map((b) => b.toString(16)).join(" ") });
    const [torchBf16, torchBf16ToF16, torchF16ToBf16, torchF16] = out.trim().split("\n")
      .map((line) => line.split(" ").map(Number));
    // NaN bits differ: torch 1.13's CPU kernels write every bf16 NaN as 0xffff (c10's scalar
    // conversion and CUDA write 0x7fc0, as we do: the reference test pins that), and f16 NaNs
    // keep implementation-defined payloads. So a NaN matches any NaN; other bits must agree.
    const bf16Nan = (h: number) => (h & 0x7f80) === 0x7f80 && (h & 0x7f) !== 0;
    const f16Nan = (h: number) => (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;
    const check = (got: number[], want: number[], isNan: (h: number) => boolean, what: string) =>
      assertBits(got.map((v, i) => (isNan(v) && isNan(want[i]) ? want[i] : v)), want, inputs, what);
    check([...bf16FromF32(Float32Array.from(inputs, f32Of))], torchBf16, bf16Nan, "host");
    await owning(async (own) => {
      const b = own(cast(own(f32TensorOfBits(inputs)), "bf16"));
      check(await bitsOf(b), torchBf16, bf16Nan, "GPU f32 → bf16");
      if (!gpu.f16) return;
      const toF16 = new Float16Array(await own(cast(b, "f16")).read());
      check([...new Uint16Array(toF16.buffer)], torchBf16ToF16, f16Nan, "GPU bf16 → f16");
      const h = own(Tensor.empty([inputs.length], "f16"));
      h.writeBytes(new Uint8Array(Uint16Array.from(torchF16).buffer));
      check(await bitsOf(own(cast(h, "bf16"))), torchF16ToBf16, bf16Nan, "GPU f16 → bf16");
    });
  },
});

Deno.test({
  name: "cast among f32, f16 and bf16, all six directions, each rounding once from the exact value",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    // Finite values over f16's range and past it (f16 overflows to Inf, bf16 does not), its
    // subnormals, ties of both formats, and random values of every magnitude.
    const random = rng(5);
    const values = [
      0,
      -0,
      1,
      -1,
      65504,
      -65504,
      65520,
      1e5,
      -3e38,
      2 ** -24,
      2 ** -25,
      3 * 2 ** -26,
      2 ** -140,
      1 + 2 ** -8,
      1 + 3 * 2 ** -8,
      1 + 2 ** -11,
      1 + 3 * 2 ** -11,
      1 / 3,
      Infinity,
      -Infinity,
      ...Array.from({ length: 3001 }, () => (random() - 0.5) * 2 ** Math.floor(random() * 60 - 30)),
    ].map(Math.fround);
    const f16 = (v: number) => new Float16Array([v])[0]; // round to nearest even, from f64
    const bf16 = (v: number) => f32Of(bf16Reference(Math.fround(v)) << 16);
    const stored = { f32: values, f16: values.map(f16), bf16: values.map(bf16) };
    const round = { f32: Math.fround, f16, bf16 };
    await owning(async (own) => {
      for (const from of ["f32", "f16", "bf16"] as const) {
        const x = own(Tensor.from(stored[from], [stored[from].length], { dtype: from }));
        for (const to of ["f32", "f16", "bf16"] as const) {
          if (to === from) continue;
          const y = own(cast(x, to));
          assert.equal(y.dtype, to);
          const got = await y.read(), want = stored[from].map(round[to]);
          want.forEach((w, i) =>
            assert.ok(
              Object.is(got[i], w),
              `${from} → ${to}: ${stored[from][i]} gave ${got[i]}, expected ${w}`,
            )
          );
        }
      }
    });
  },
});

Deno.test({
  name: "bf16 view ops move bits exactly (NaN payloads too) at odd shapes and odd offsets: " +
    "reshape, flatten, permute, narrow, split, and their gradients",
  ...GPU_TEST,
  async fn() {
    const random = rng(6);
    const shape = [3, 5, 7, 3], n = 3 * 5 * 7 * 3;
    // Any 16-bit pattern, NaNs with payloads and negative NaNs included.
    const bits = Array.from({ length: n }, () => Math.floor(random() * 0x10000));
    const at = (c: number[]) => bits[((c[0] * 5 + c[1]) * 7 + c[2]) * 3 + c[3]];
    await owning(async (own) => {
      const x = own(bf16TensorOfBits(bits, shape));
      assert.deepEqual(await bitsOf(reshape(x, [15, 21])), bits, "reshape");
      assert.deepEqual(await bitsOf(flatten(x)), bits, "flatten");
      const order = [2, 0, 3, 1], outShape = order.map((a) => shape[a]);
      const expected: number[] = [];
      for (let a = 0; a < outShape[0]; a++) {
        for (let b = 0; b < outShape[1]; b++) {
          for (let c = 0; c < outShape[2]; c++) {
            for (let d = 0; d < outShape[3]; d++) {
              const src = [0, 0, 0, 0];
              [a, b, c, d].forEach((v, k) => (src[order[k]] = v));
              expected.push(at(src));
            }
          }
        }
      }
      assert.deepEqual(await bitsOf(own(permute(x, order))), expected, "permute");
      // Windows starting at odd elements: along the last axis (offset 1 of rows of 3), and
      // along axis 1 (offset 7·3 = 21 of 105).
      for (const [axis, start, length] of [[3, 1, 1], [3, 1, 2], [1, 1, 3], [2, 3, 3]]) {
        const want: number[] = [];
        for (let i = 0; i < n; i++) {
          const c = [Math.floor(i / 105), Math.floor(i / 21) % 5, Math.floor(i / 3) % 7, i % 3];
          if (c[axis] >= start && c[axis] < start + length) want.push(bits[i]);
        }
        assert.deepEqual(await bitsOf(own(narrow(x, axis, start, length))), want, `narrow ${axis}`);
      }
      const pieces = split(x, [1, 3, 1], 1).map(own);
      const joined: number[][] = [[], [], []];
      for (let i = 0; i < n; i++) {
        const j = Math.floor(i / 21) % 5;
        joined[j === 0 ? 0 : j < 4 ? 1 : 2].push(bits[i]);
      }
      for (let k = 0; k < 3; k++) {
        assert.deepEqual(await bitsOf(pieces[k]), joined[k], `split ${k}`);
      }
    });
    // Gradients of the view ops come back in bf16, exactly: the window's gradient padded with
    // zeros, the permutation's inverse.
    await owning(async (own) => {
      const values = Array.from({ length: n }, () => Math.round(random() * 200 - 100) / 8);
      const x = own(Tensor.from(values, shape, { dtype: "bf16", requiresGrad: true }));
      const y = own(permute(own(narrow(reshape(x, [15, 21]), 1, 3, 17)), [1, 0]));
      const g = Array.from({ length: y.size }, (_, i) => i % 2 ? -i / 4 : i / 4);
      y.backward({ gradient: own(Tensor.from(g, y.shape, { dtype: "bf16" })) });
      own(x.grad!);
      assert.equal(x.grad!.dtype, "bf16");
      const dx = await x.grad!.read(), want = new Array<number>(n).fill(0);
      for (let r = 0; r < 15; r++) {
        for (let c = 0; c < 17; c++) want[r * 21 + 3 + c] = g[c * 15 + r];
      }
      assert.deepEqual([...dx], want.map((v) => f32Of(bf16Reference(v) << 16)));
    });
  },
});

Deno.test({
  name: "bf16 needs no shader-f16: casts, elementwise, sums, views, dropout and embedding run " +
    "on a device made with initGpu({ f16: 'off' })",
  ...GPU_TEST,
  async fn() {
    const plain = await initGpu({ f16: "off", matmulTiling: "default", setDefault: false });
    assert.equal(plain.f16, false);
    try {
      const values = [1, -2, 0.5, 3, 1 + 2 ** -8, -0.25, 7];
      const x = Tensor.from(values, [7], { dtype: "bf16", gpu: plain });
      const table = Tensor.from(values.slice(0, 6), [3, 2], { dtype: "bf16", gpu: plain });
      const ids = Tensor.from([2, 0, 2], [3], { dtype: "i32", gpu: plain });
      const results = tidy(() => ({
        wide: cast(x, "f32"),
        doubled: add(x, x),
        total: sum(x),
        window: narrow(x, 0, 1, 5),
        swapped: permute(reshape(table, [3, 2]), [1, 0]),
        kept: dropout(x, 0, new RandomGenerator(2).take(7)),
        rows: embedding(table, ids),
      }));
      const r = Object.fromEntries(
        await Promise.all(Object.entries(results).map(async ([k, t]) => [k, [...await t.read()]])),
      );
      const bf16 = values.map((v) => f32Of(bf16Reference(v) << 16));
      assert.deepEqual(r.wide, bf16);
      assert.deepEqual(r.doubled, bf16.map((v) => 2 * v));
      assert.deepEqual(r.total, [f32Of(bf16Reference(bf16.reduce((a, b) => a + b)) << 16)]);
      assert.deepEqual(r.window, bf16.slice(1, 6));
      assert.deepEqual(r.swapped, [bf16[0], bf16[2], bf16[4], bf16[1], bf16[3], bf16[5]]);
      assert.deepEqual(r.kept, bf16);
      assert.deepEqual(r.rows, [bf16[4], bf16[5], bf16[0], bf16[1], bf16[4], bf16[5]]);
      for (const t of [x, table, ids, ...Object.values(results)]) t.dispose();
    } finally {
      plain.destroy();
    }
  },
});
