/**
 * Adam(W) with `stateDtype: "8bit"` against an f64 reference of
 * bitsandbytes' blockwise algorithm written here (dequantize, update,
 * absmax per 256-element block, nearest code): each step starts both from
 * the same quantized state, so masters, scales and codes must agree within
 * f32 rounding (a code may differ only where the value sits on a midpoint
 * between two codes). The code maps are bitsandbytes' `create_dynamic_map`
 * run under PyTorch.
 */
import assert from "node:assert/strict";
import { Adam, AdamW, type OptimizerStateDict, Tensor } from "../../mod.ts";
import { dynamicCode } from "../../optim/_dynamic_code.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { runTorch } from "../helpers/torch.ts";
import { uniform } from "../helpers/reference.ts";

/** bitsandbytes.functional.create_dynamic_map (0.41), as published. */
const CREATE_DYNAMIC_MAP = `
import json, torch
def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    data = []
    non_sign_bits = total_bits - (1 if signed else 1)
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
            else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = torch.linspace(0.1, 1, fraction_items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if additional_items > 0:
        boundaries = torch.linspace(0.1, 1, additional_items + 1)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    data.sort()
    return data
print(json.dumps([create_dynamic_map(True), create_dynamic_map(False)]))
`;

const [SIGNED, UNSIGNED] = JSON.parse(await runTorch(CREATE_DYNAMIC_MAP)) as number[][];
const BLOCK = 256;
const BETAS = [0.9, 0.999] as const;
const EPS = 1e-8;

Deno.test("the dynamic maps are bitsandbytes' create_dynamic_map", () => {
  for (const [ours, theirs] of [[dynamicCode(true), SIGNED], [dynamicCode(false), UNSIGNED]]) {
    assert.equal(ours.length, 256);
    assert.equal(theirs.length, 256);
    for (let i = 0; i < 256; i++) {
      // bitsandbytes rounds its linspace in f32; ours rounds once from f64.
      assert.ok(Math.abs(ours[i] - theirs[i]) <= 2.5e-7 * Math.abs(theirs[i]), `code ${i}`);
    }
  }
  assert.equal(SIGNED[127], 0);
  assert.equal(UNSIGNED[0], 0);
});

/** Index of the code nearest to `x` (ties to the lower index). */
function nearest(code: readonly number[], x: number): number {
  let best = 0;
  for (let c = 1; c < 256; c++) if (Math.abs(code[c] - x) < Math.abs(code[best] - x)) best = c;
  return best;
}

/** A parameter's 8-bit moments as a state dict holds them. */
interface Quantized {
  m: Uint8Array;
  v: Uint8Array;
  mScale: Float32Array;
  vScale: Float32Array;
}

/** The f64 blockwise 8-bit Adam(W) step, from bitsandbytes' description: the new state and master. */
function reference8bit(
  p: Float32Array,
  g: ArrayLike<number>,
  s: Quantized,
  t: number,
  o: { lr: number; wd: number; decoupled: boolean },
): { p: Float64Array; m: Float64Array; v: Float64Array; mScale: number[]; vScale: number[] } {
  const n = p.length, [b1, b2] = BETAS;
  const out = { p: new Float64Array(n), m: new Float64Array(n), v: new Float64Array(n) };
  const bc1 = 1 - b1 ** t, bc2 = 1 - b2 ** t;
  for (let i = 0; i < n; i++) {
    const b = Math.floor(i / BLOCK);
    let w = p[i], gi = g[i];
    if (o.decoupled) w *= 1 - o.lr * o.wd;
    else gi += o.wd * w;
    const m = b1 * SIGNED[s.m[i]] * s.mScale[b] + (1 - b1) * gi;
    const v = b2 * UNSIGNED[s.v[i]] * s.vScale[b] + (1 - b2) * gi * gi;
    out.p[i] = w - (o.lr / bc1) * m / (Math.sqrt(v) / Math.sqrt(bc2) + EPS);
    out.m[i] = m;
    out.v[i] = v;
  }
  const blocks = Math.ceil(n / BLOCK), mScale: number[] = [], vScale: number[] = [];
  for (let b = 0; b < blocks; b++) {
    let am = 0, av = 0;
    for (let i = b * BLOCK; i < Math.min(n, (b + 1) * BLOCK); i++) {
      am = Math.max(am, Math.abs(out.m[i]));
      av = Math.max(av, out.v[i]);
    }
    mScale.push(am);
    vScale.push(av);
  }
  return { ...out, mScale, vScale };
}

/** Random codes and scales for a parameter of `n` elements (zero scales where `zeroBlocks`). */
function randomState(n: number, seed: number, zeroBlocks: number[] = []): Quantized {
  const blocks = Math.ceil(n / BLOCK);
  const r = uniform(2 * n + 2 * blocks, seed, 0, 1);
  const s: Quantized = {
    m: Uint8Array.from({ length: n }, (_, i) => Math.floor(r[i] * 256)),
    v: Uint8Array.from({ length: n }, (_, i) => Math.floor(r[n + i] * 256)),
    mScale: Float32Array.from({ length: blocks }, (_, b) => 0.05 * r[2 * n + b]),
    vScale: Float32Array.from({ length: blocks }, (_, b) => 1e-3 * r[2 * n + blocks + b]),
  };
  for (const b of zeroBlocks) s.mScale[b] = s.vScale[b] = 0;
  return s;
}

/** `fresh` (a one-parameter 8-bit Adam's state dict) holding `s` at step `t`. */
function holding(fresh: OptimizerStateDict, s: Quantized, t: number): OptimizerStateDict {
  const buffers = { expAvg: s.m, expAvgSq: s.v, expAvgAbsmax: s.mScale, expAvgSqAbsmax: s.vScale };
  return { ...fresh, step: t, state: [{ ...fresh.state[0], buffers }] };
}

/** The smallest normal f32: a GPU may flush values below it to zero. */
const FLT_MIN = 2 ** -126;

/**
 * Checks one 8-bit step of `n` elements from state `s` with gradient `g`
 * against {@link reference8bit}; returns how many codes took a neighbour
 * (only allowed on a midpoint).
 */
async function checkStep(
  what: string,
  n: number,
  g: Float32Array,
  s: Quantized,
  o: { lr: number; wd: number; decoupled: boolean; t?: number },
): Promise<number> {
  const init = Float32Array.from(uniform(n, n + 3));
  const p = Tensor.from(init, [n]);
  const Opt = o.decoupled ? AdamW : Adam;
  const opt = new Opt([p], { lr: o.lr, weightDecay: o.wd, stateDtype: "8bit", min8bitSize: 0 });
  const t = o.t ?? 3;
  opt.loadStateDict(holding(await opt.stateDict(), s, t - 1));
  p.grad = Tensor.from(g, [n]);
  opt.step();
  const want = reference8bit(init, g, s, t, o);
  const got = (await opt.stateDict()).state[0].buffers;
  const w = await p.read();
  for (let i = 0; i < n; i++) {
    const step = Math.abs(want.p[i] - init[i]);
    const err = Math.abs(w[i] - want.p[i]);
    assert.ok(
      err <= 1e-6 * Math.abs(want.p[i]) + 1e-5 * step + 1e-12,
      `${what}: p[${i}] ${w[i]} vs ${want.p[i]}`,
    );
  }
  const scales = [[got.expAvgAbsmax, want.mScale], [got.expAvgSqAbsmax, want.vScale]] as const;
  for (const [ours, ref] of scales) {
    assert.equal(ours.length, Math.ceil(n / BLOCK), `${what}: scale count`);
    ref.forEach((r, b) =>
      assert.ok(
        Math.abs(ours[b] - r) <= 1e-6 * r + FLT_MIN,
        `${what}: scale ${b}: ${ours[b]} vs ${r}`,
      )
    );
  }
  let neighbours = 0;
  const codes = [
    [got.expAvg, want.m, want.mScale, SIGNED],
    [got.expAvgSq, want.v, want.vScale, UNSIGNED],
  ] as const;
  for (const [ours, values, scale, code] of codes) {
    for (let i = 0; i < n; i++) {
      const am = scale[Math.floor(i / BLOCK)], value = values[i];
      const r = nearest(code, am > 0 ? value / am : 0), c = ours[i];
      if (c === r) continue;
      neighbours++;
      // Compared as values: a subnormal block (am < FLT_MIN) may be flushed to zero by the GPU.
      const excess = Math.abs(code[c] * am - value) - Math.abs(code[r] * am - value);
      const allowed = 1e-6 * Math.abs(value) + 1e-12 * am + (am < FLT_MIN ? FLT_MIN : 0);
      assert.ok(excess <= allowed, `${what}: code ${i} is ${c}, nearest ${r} (${value} / ${am})`);
    }
  }
  opt.dispose();
  p.dispose();
  return neighbours;
}

const gradient = (n: number, seed: number, scale = 0.1) =>
  Float32Array.from(uniform(n, seed, -scale, scale));

Deno.test(
  "8-bit Adam(W): one step from a quantized state matches the f64 blockwise reference",
  GPU_TEST,
  async () => {
    let neighbours = 0, total = 0;
    // Block edges (255, 256, 257), a thread's words cut (1023, 2051), sizes across
    // workgroups of 4096 elements (4099, 9001).
    for (const [k, n] of [1, 255, 256, 257, 1023, 1025, 2051, 4099, 9001].entries()) {
      for (const decoupled of [false, true]) {
        const o = { lr: 1e-2, wd: 0.1, decoupled };
        neighbours += await checkStep(
          `n ${n}, decoupled ${decoupled}`,
          n,
          gradient(n, 17 + k),
          randomState(n, 5 + k),
          o,
        );
        total += 2 * n;
      }
    }
    // A code may take a neighbour only on a midpoint: rare, or the check above could not fail.
    assert.ok(neighbours <= total * 0.01, `${neighbours} of ${total} codes took a neighbour`);
  },
);

Deno.test(
  "8-bit Adam: zeros, one huge value in a block, subnormal second moments",
  GPU_TEST,
  async () => {
    const n = 3 * BLOCK + 5;
    const o = { lr: 1e-3, wd: 0, decoupled: true };
    // All-zero state and gradient in blocks 0 and 2: scales stay 0, codes the map's zero.
    const zeros = gradient(n, 3);
    zeros.fill(0, 0, BLOCK);
    zeros.fill(0, 2 * BLOCK, 3 * BLOCK);
    await checkStep("zero blocks", n, zeros, randomState(n, 4, [0, 2]), o);
    // One huge value: the block's scale follows it, the rest round to the smallest codes or 0.
    const huge = gradient(n, 6, 1e-3);
    huge[BLOCK + 17] = 1e4;
    await checkStep("one huge value", n, huge, randomState(n, 7, [1]), o);
    // Gradients of 3e-20: (1 − β₂)·g² ≈ 1e-42 is subnormal in f32 (a GPU may flush it to 0).
    const tiny = gradient(n, 8, 3e-20);
    const s = randomState(n, 9, [0, 1, 2, 3]);
    await checkStep("subnormal v", n, tiny, s, { ...o, t: 1 });
  },
);

Deno.test(
  "8-bit Adam: values across every decade of the maps, both signs, take their nearest code",
  GPU_TEST,
  async () => {
    // From a zero state, m = (1 − β₁)·g and v = (1 − β₂)·g²: log-spaced |g| from 1 down to
    // 1e-8 per block (its first element the block's max) puts m / absmax in every decade of
    // the signed map and v / absmax across the unsigned one and below it.
    const n = 4 * BLOCK;
    const g = Float32Array.from({ length: n }, (_, i) => {
      const k = i % BLOCK;
      return (k % 2 === 0 ? 1 : -1) * 10 ** (-8 * k / (BLOCK - 1)) * (1 + (i >> 8) / 7);
    });
    const zero: Quantized = {
      m: new Uint8Array(n).fill(127),
      v: new Uint8Array(n),
      mScale: new Float32Array(4),
      vScale: new Float32Array(4),
    };
    await checkStep("log-spaced", n, g, zero, { lr: 1e-3, wd: 0, decoupled: true, t: 1 });
  },
);

Deno.test(
  "8-bit Adam: a skipped step leaves codes, scales and masters bit-identical",
  GPU_TEST,
  async () => {
    const n = 5000;
    const p = Tensor.from(uniform(n, 1), [n]);
    const opt = new AdamW([p], { lr: 1e-2, stateDtype: "8bit" });
    p.grad = Tensor.from(gradient(n, 2), [n]);
    opt.step();
    const before = await opt.stateDict(), w = await p.read();
    assert.ok(before.state[0].buffers.expAvg instanceof Uint8Array);
    p.grad.dispose();
    p.grad = Tensor.from(gradient(n, 3), [n]);
    for (const flag of [1, NaN, Infinity]) opt.step({ foundInf: Tensor.from([flag], [1]) });
    assert.deepStrictEqual(await opt.stateDict(), before);
    assert.deepStrictEqual(await p.read(), w);
    opt.step();
    assert.notDeepStrictEqual((await opt.stateDict()).state[0].buffers, before.state[0].buffers);
    opt.dispose();
  },
);

Deno.test(
  "8-bit Adam: tensors below min8bitSize keep f32 states; options are checked",
  GPU_TEST,
  async () => {
    const small = Tensor.zeros([4095]), big = Tensor.zeros([4096]);
    const opt = new Adam([small, big], { stateDtype: "8bit" });
    assert.equal(opt.min8bitSize, 4096);
    for (const t of [small, big]) t.grad = Tensor.full(t.shape, 0.5);
    opt.step();
    const [f32, eight] = (await opt.stateDict()).state.map((s) => s.buffers);
    assert.deepStrictEqual(Object.keys(f32), ["expAvg", "expAvgSq"]);
    assert.ok(f32.expAvg instanceof Float32Array);
    assert.deepStrictEqual(Object.keys(eight), [
      "expAvg",
      "expAvgSq",
      "expAvgAbsmax",
      "expAvgSqAbsmax",
    ]);
    // m = 0.05 everywhere: every code is the map's 1.0 (index 255), the scale 0.05.
    assert.ok((eight.expAvg as Uint8Array).every((c) => c === 255));
    assert.deepStrictEqual(eight.expAvgAbsmax, new Float32Array(16).fill(Math.fround(0.1 * 0.5)));
    opt.dispose();
    assert.throws(
      () => new Adam([big], { stateDtype: "int8" as never }),
      /stateDtype must be "f32", "bf16" or "8bit"/,
    );
    assert.throws(
      () => new Adam([big], { min8bitSize: 16 }),
      /min8bitSize applies to stateDtype "8bit" only/,
    );
    assert.throws(
      () => new Adam([big], { stateDtype: "8bit", min8bitSize: -1 }),
      /min8bitSize must be an integer >= 0/,
    );
  },
);
