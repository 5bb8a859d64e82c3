import assert from "node:assert/strict";
import {
  autocast,
  causalAttention,
  CausalSelfAttention,
  mul,
  sum,
  Tensor,
  tidy,
  TransformerBlock,
} from "../../../mod.ts";
import { GPU_TEST } from "../../helpers/gpu.ts";
import { gradcheck, paramGradcheck } from "../../helpers/gradcheck.ts";
import { quantize, uniform } from "../../helpers/reference.ts";
import { assertClose, TOL } from "../../helpers/assert.ts";
import { causalAttention64 } from "../../helpers/attention_reference.ts";

// Odd sizes (T not a multiple of any tile, T > 32), one head, one token, one batch.
const DIMS = [
  { b: 2, t: 5, h: 3, d: 4 },
  { b: 1, t: 1, h: 1, d: 8 },
  { b: 2, t: 37, h: 2, d: 8 },
  { b: 3, t: 16, h: 4, d: 16 },
];

// f16: q·kᵀ is stored in f16 (relative half-ulp 4.9e-4 on scores up to ~4, so up to 2e-3
// absolute before the softmax), the probabilities are stored in f16 again, and the output
// sums T of them times v; 5e-3 covers that chain with room for f32 accumulation. bf16: the
// same chain with bf16's half-ulp of 2⁻⁹ ≈ 2e-3 relative, 8 times f16's: 8 times the bound.
const ATTENTION_TOL = {
  f32: TOL.f32,
  f16: { atol: 5e-3, rtol: 5e-3 },
  bf16: { atol: 4e-2, rtol: 4e-2 },
};

Deno.test({
  name: "causalAttention: matches f64 multi-head causal attention, fused or not, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const dims of DIMS) {
      const cases = [true, false].flatMap((fused) =>
        (["f32", "f16", "bf16"] as const).map((dtype) => ({ fused, dtype }))
      );
      for (const { fused, dtype } of cases) {
        const { b, t, h, d } = dims, n = b * t * h * d, shape = [b, t, h * d];
        const [q, k, v] = [1, 2, 3].map((s) => quantize(uniform(n, s + n, -2, 2), dtype));
        const y = tidy(() =>
          causalAttention(
            Tensor.from(q, shape, { dtype }),
            Tensor.from(k, shape, { dtype }),
            Tensor.from(v, shape, { dtype }),
            { heads: h, fused },
          )
        );
        assert.deepEqual(y.shape, shape);
        assert.equal(y.dtype, dtype);
        const label = `${dtype} ${JSON.stringify(dims)} fused ${fused}`;
        assertClose(await y.read(), causalAttention64(q, k, v, dims), ATTENTION_TOL[dtype], label);
        y.dispose();
      }
    }
  },
});

Deno.test({
  name: "causalAttention: gradients of q, k and v agree with finite differences, fused or not",
  ...GPU_TEST,
  async fn() {
    const [b, t, c] = [2, 6, 8];
    const w = Tensor.from(uniform(b * t * c, 1), [b, t, c]);
    for (const [heads, fused] of [[1, true], [2, true], [2, false]] as const) {
      await gradcheck(
        `causalAttention ${heads} heads, fused ${fused}`,
        ([q, k, v]) => sum(mul(causalAttention(q, k, v, { heads, fused }), w)),
        [2, 3, 4].map((s) => uniform(b * t * c, s, -1.5, 1.5)),
        [[b, t, c], [b, t, c], [b, t, c]],
      );
    }
    w.dispose();
  },
});

/** y = x·Wᵀ + bias in f64 for x [rows, in] and W [out, in]. */
function linear64(x: ArrayLike<number>, w: ArrayLike<number>, bias: ArrayLike<number>) {
  const out = bias.length, inF = w.length / out, rows = x.length / inF;
  const y = new Float64Array(rows * out);
  for (let r = 0; r < rows; r++) {
    for (let o = 0; o < out; o++) {
      let s = bias[o];
      for (let i = 0; i < inF; i++) s += x[r * inF + i] * w[o * inF + i];
      y[r * out + o] = s;
    }
  }
  return y;
}

Deno.test({
  name: "CausalSelfAttention: projections, heads and output projection match f64",
  ...GPU_TEST,
  async fn() {
    const [b, t, c, h] = [2, 7, 12, 3];
    const layer = new CausalSelfAttention(c, h, { seed: 5 });
    assert.deepEqual(
      layer.namedParameters().map(([name]) => name),
      ["qkv.weight", "qkv.bias", "output.weight", "output.bias"],
    );
    const x = uniform(b * t * c, 6);
    const y = tidy(() => layer.forward(Tensor.from(x, [b, t, c])));
    const p = new Map<string, Float32Array | Int32Array>();
    for (const [name, tensor] of layer.namedParameters()) p.set(name, await tensor.read());
    const proj = (name: string, input: ArrayLike<number>) =>
      linear64(input, p.get(`${name}.weight`)!, p.get(`${name}.bias`)!);
    // qkv's rows are the query, key and value weights in turn (nanoGPT's c_attn).
    const qkv = proj("qkv", x);
    const [q, k, v] = [0, 1, 2].map((part) =>
      Float64Array.from(
        { length: b * t * c },
        (_, i) => qkv[Math.floor(i / c) * 3 * c + part * c + (i % c)],
      )
    );
    const a = causalAttention64(q, k, v, { b, t, h, d: c / h });
    assertClose(await y.read(), proj("output", a), TOL.f32, "attention layer");
    y.dispose();
    layer.dispose();
    assert.throws(
      () => new CausalSelfAttention(10, 3),
      /CausalSelfAttention: heads \(3\) must be a positive integer that divides dim \(10\)/,
    );
  },
});

Deno.test({
  name: "CausalSelfAttention and TransformerBlock: parameter and input gradients agree with FD",
  ...GPU_TEST,
  async fn() {
    const [b, t, c] = [2, 5, 8];
    const w = Tensor.from(uniform(b * t * c, 7), [b, t, c]);
    const x = Tensor.from(uniform(b * t * c, 8), [b, t, c]);
    for (const layer of [new CausalSelfAttention(c, 2, { seed: 1 }), new TransformerBlock(c, 2)]) {
      const label = layer.constructor.name;
      // Every bias and LayerNorm vector (at most 32 entries) is also checked entry by entry.
      await paramGradcheck(label, layer, () => sum(mul(layer.forward(x), w)), {
        elementwiseMax: 32,
      });
      await gradcheck(
        `${label} input`,
        ([xi]) => sum(mul(layer.forward(xi), w)),
        [uniform(b * t * c, 9)],
        [[b, t, c]],
      );
      layer.dispose();
    }
    w.dispose();
    x.dispose();
  },
});

Deno.test({
  name: "TransformerBlock: under autocast the residual stream stays f32; bad shapes are errors",
  ...GPU_TEST,
  fn() {
    const block = new TransformerBlock(8, 2, { seed: 3 });
    tidy(() => {
      const x = Tensor.from(uniform(2 * 3 * 8, 1), [2, 3, 8]);
      assert.equal(autocast(() => block.forward(x)).dtype, "f32");
      assert.equal(autocast(() => block.forward(x), { dtype: "bf16" }).dtype, "f32");
      const q = Tensor.zeros([2, 3, 8]);
      for (const fused of [true, false]) {
        const op = fused ? "fusedCausalAttention" : "causalAttention";
        assert.throws(
          () => causalAttention(q, Tensor.zeros([2, 4, 8]), q, { heads: 2, fused }),
          new RegExp(`${op}: q, k and v must all be \\[batch, T, `),
        );
        assert.throws(
          () => causalAttention(q, q, q, { heads: 3, fused }),
          new RegExp(`${op}: heads \\(3\\) must be a positive integer that divides the 8 features`),
        );
      }
    });
    block.dispose();
  },
});

Deno.test({
  name: "CausalSelfAttention: a halfstep 0.1 state (query, key, value) loads into qkv",
  ...GPU_TEST,
  async fn() {
    const c = 6, source = new CausalSelfAttention(c, 2, { seed: 4 });
    const host = (values: Float32Array | Int32Array, shape: number[]) => ({
      dtype: "f32" as const,
      shape,
      data: new Uint8Array(values.slice().buffer),
    });
    const weight = await source.qkv.weight.read(), bias = await source.qkv.bias!.read();
    const legacy = new Map<string, ReturnType<typeof host>>();
    ["query", "key", "value"].forEach((name, i) => {
      legacy.set(`${name}.weight`, host(weight.subarray(i * c * c, (i + 1) * c * c), [c, c]));
      legacy.set(`${name}.bias`, host(bias.subarray(i * c, (i + 1) * c), [c]));
    });
    legacy.set("output.weight", host(await source.output.weight.read(), [c, c]));
    legacy.set("output.bias", host(await source.output.bias!.read(), [c]));
    const target = new CausalSelfAttention(c, 2, { seed: 9 });
    target.loadStateDict(legacy);
    assert.deepEqual(await target.qkv.weight.read(), weight);
    assert.deepEqual(await target.qkv.bias!.read(), bias);
    assert.equal(legacy.has("query.weight"), true, "the caller's map is not changed");
    legacy.delete("value.bias");
    assert.throws(() => target.loadStateDict(legacy), /missing qkv.bias/);
    source.dispose();
    target.dispose();
  },
});
