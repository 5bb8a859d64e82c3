/**
 * Adam(W) with `stateDtype: "bf16"` (torchao's bf16 states): one step
 * against an f64 reference, each stored moment one of the two bf16 values
 * around the exact one; stochastic rounding unbiased (the share rounded up
 * matches the value's position between its neighbours) and the same bits
 * on every run.
 */
import assert from "node:assert/strict";
import { AdamW, type OptimizerStateDict, Tensor } from "../../mod.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { uniform } from "../helpers/reference.ts";

/** The bf16 values just below and above |x| (truncated and truncated + 1 ulp), as bits with x's sign. */
function bf16Neighbours(x: number): [number, number] {
  const bits = new Uint32Array(Float32Array.of(x).buffer)[0];
  const down = bits >>> 16;
  return (bits & 0xffff) === 0 ? [down, down] : [down, down + 1];
}

/** bf16 bits as a number. */
function bf16Value(bits: number): number {
  return new Float32Array(Uint32Array.of(bits << 16).buffer)[0];
}

Deno.test(
  "bf16 states: one step matches the f64 reference, moments rounded to a neighbour",
  GPU_TEST,
  async () => {
    const n = 1031, lr = 1e-2, wd = 0.01, [b1, b2] = [0.9, 0.999], t = 4;
    const init = Float32Array.from(uniform(n, 1));
    const p = Tensor.from(init, [n]);
    const opt = new AdamW([p], { lr, weightDecay: wd, stateDtype: "bf16" });
    // A state of random bf16 moments (v > 0) at step t − 1.
    const m0 = Uint16Array.from(uniform(n, 2, -0.1, 0.1), (x) => bf16Neighbours(x)[0]);
    const v0 = Uint16Array.from(uniform(n, 3, 1e-4, 1e-2), (x) => bf16Neighbours(x)[0]);
    const fresh = await opt.stateDict();
    const buffers = { expAvg: m0, expAvgSq: v0 };
    opt.loadStateDict({ ...fresh, step: t - 1, state: [{ ...fresh.state[0], buffers }] });
    const g = Float32Array.from(uniform(n, 4, -1, 1));
    p.grad = Tensor.from(g, [n]);
    opt.step();
    const got = (await opt.stateDict()).state[0].buffers as Record<string, Uint16Array>;
    const w = await p.read();
    const bc1 = 1 - b1 ** t, bc2 = 1 - b2 ** t;
    for (let i = 0; i < n; i++) {
      const m = b1 * bf16Value(m0[i]) + (1 - b1) * g[i];
      const v = b2 * bf16Value(v0[i]) + (1 - b2) * g[i] * g[i];
      const want = init[i] * (1 - lr * wd) -
        (lr / bc1) * m / (Math.sqrt(v) / Math.sqrt(bc2) + 1e-8);
      assert.ok(
        Math.abs(w[i] - want) <= 1e-6 * Math.abs(want) + 1e-7,
        `p[${i}] ${w[i]} vs ${want}`,
      );
      // The f32 m and v may differ from f64 in the last bits, so either neighbour of each.
      for (const [ours, x] of [[got.expAvg[i], m], [got.expAvgSq[i], v]]) {
        const [lo, hi] = bf16Neighbours(x);
        assert.ok(ours === lo || ours === hi, `moment ${i}: ${ours} for ${x} (${lo}, ${hi})`);
      }
    }
    opt.dispose();
  },
);

Deno.test(
  "bf16 states: stochastic rounding is unbiased and the same bits on every run",
  GPU_TEST,
  async () => {
    const n = 1 << 16, g = 0.3;
    const run = async () => {
      const p = Tensor.zeros([n]);
      const opt = new AdamW([p], { lr: 1e-3, stateDtype: "bf16" });
      p.grad = Tensor.full([n], g);
      opt.step();
      const state = await opt.stateDict();
      opt.dispose();
      p.dispose();
      return state;
    };
    const first = await run();
    assert.deepStrictEqual(await run(), first);
    const bufs = first.state[0].buffers as Record<string, Uint16Array>;
    for (const [name, exact] of [["expAvg", 0.1 * g], ["expAvgSq", 0.001 * g * g]] as const) {
      const x = Math.fround(exact);
      const [lo, hi] = bf16Neighbours(x);
      const share = (x - bf16Value(lo)) / (bf16Value(hi) - bf16Value(lo));
      const up = bufs[name].filter((b) => b === hi).length;
      assert.equal(
        bufs[name].filter((b) => b !== lo && b !== hi).length,
        0,
        `${name}: other values`,
      );
      // Binomial: within 5 standard deviations of n · share (round-to-nearest would give 0 or n).
      const sd = Math.sqrt(n * share * (1 - share));
      assert.ok(
        Math.abs(up - n * share) <= 5 * sd,
        `${name}: ${up} of ${n} up, expected ${n * share}`,
      );
    }
  },
);

Deno.test(
  "bf16 states: a saved state dict holds bf16 bits; non-finite or negative ones are refused",
  GPU_TEST,
  async () => {
    const p = Tensor.zeros([10]);
    const opt = new AdamW([p], { stateDtype: "bf16" });
    const s: OptimizerStateDict = await opt.stateDict();
    assert.equal(s.stateDtype, "bf16");
    const bad = (buffers: Record<string, Uint16Array | Float32Array>) => ({
      ...s,
      state: [{ ...s.state[0], buffers }],
    });
    const zeros = () => new Uint16Array(10);
    const inf = zeros().fill(0x7f80);
    assert.throws(
      () => opt.loadStateDict(bad({ expAvg: inf, expAvgSq: zeros() })),
      /buffer expAvg holds 10 non-finite value\(s\)/,
    );
    const negative = zeros().fill(0xbf80); // −1
    assert.throws(
      () => opt.loadStateDict(bad({ expAvg: zeros(), expAvgSq: negative })),
      /buffer expAvgSq holds 10 negative value\(s\)/,
    );
    assert.throws(
      () => opt.loadStateDict(bad({ expAvg: new Float32Array(10), expAvgSq: zeros() })),
      /buffer expAvg must be a Uint16Array of 10 values, got a Float32Array of 10 values/,
    );
    opt.dispose();
  },
);
