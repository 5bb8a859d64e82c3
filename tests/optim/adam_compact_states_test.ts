/**
 * What 8-bit and bf16 Adam states share with the f32 ones: results do not
 * depend on how many tensors share a dispatch, working copies (f16, bf16)
 * are the masters rounded, a run resumed from a state dict is the same
 * bits as one that never stopped, and a damaged or mismatched state dict is
 * refused naming the buffer or option.
 */
import assert from "node:assert/strict";
import {
  Adam,
  AdamW,
  dequantizeStates,
  type OptimizerStateDict,
  type StateDtype,
  Tensor,
} from "../../mod.ts";
import { multiTensorSettings } from "../../gpu/mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { CopyMap } from "../helpers/optimizer_reference.ts";
import { quantize, uniform } from "../helpers/reference.ts";

// Odd sizes, block (256) and workgroup (1024) edges, one below the 8-bit minimum when it is on.
const SIZES = [1, 7, 255, 257, 1023, 1025, 4097, 300];
const COMPACT: StateDtype[] = ["8bit", "bf16"];

function withSlots<T>(slots: number, fn: () => Promise<T>): Promise<T> {
  const settings = multiTensorSettings.of(gpu), chosen = settings.slots;
  settings.slots = slots;
  return fn().finally(() => settings.slots = chosen);
}

/** Parameters with working copies: f16 (where the adapter has it) for the first half, then bf16. */
function makeParams() {
  const init = SIZES.map((n, k) => quantize(uniform(n, 40 + k), "f32"));
  const params = init.map((v) => Tensor.from(v, [v.length]));
  const copies = new CopyMap();
  params.forEach((p, k) => {
    const dtype = gpu.f16 && k < SIZES.length / 2 ? "f16" : "bf16";
    copies.set(p, Tensor.from(init[k], p.shape, { dtype }));
  });
  return { params, copies };
}

function setGrads(params: Tensor[], step: number): void {
  params.forEach((p, k) => {
    // Runs of one gradient dtype, so a dispatch takes several tensors.
    const dtype = gpu.f16 && k >= SIZES.length - 2 ? "f16" : "f32";
    p.grad?.dispose();
    p.grad = Tensor.from(quantize(uniform(p.size, 31 * step + k, -1, 1), dtype), p.shape, {
      dtype,
    });
  });
}

const make = (stateDtype: StateDtype, params: Tensor[]) =>
  new AdamW(params, {
    lr: 1e-2,
    stateDtype,
    ...(stateDtype === "8bit" && { min8bitSize: 300 }),
  });

/** Where a run stands: its optimizer state, masters and copies after `step` steps. */
interface Trained {
  state: OptimizerStateDict;
  masters: Float32Array[];
  copies: Float32Array[];
  step: number;
}

async function train(stateDtype: StateDtype, steps: number, from?: Trained): Promise<Trained> {
  const { params, copies } = makeParams();
  const opt = make(stateDtype, params);
  opt.setWorkingCopies(copies);
  if (from) {
    opt.loadStateDict(from.state);
    params.forEach((p, k) => p.writeBytes(new Uint8Array(from.masters[k].buffer)));
  }
  for (let s = from?.step ?? 0; s < steps; s++) {
    setGrads(params, s);
    opt.step();
  }
  const state = {
    state: await opt.stateDict(),
    masters: await Promise.all(params.map((p) => p.read() as Promise<Float32Array>)),
    copies: await Promise.all([...copies.values()].map((c) => c.read() as Promise<Float32Array>)),
    step: steps,
  };
  // Each working copy is its master rounded to the copy's dtype.
  state.masters.forEach((m, k) => {
    const copy = copies.get(params[k])!;
    const want = Float32Array.from(quantize(m, copy.dtype as "f16" | "bf16"));
    assert.deepStrictEqual(state.copies[k], want, `${stateDtype}: copy ${k}`);
  });
  opt.dispose();
  for (const p of params) p.dispose();
  for (const c of copies.values()) c.dispose();
  return state;
}

Deno.test(
  "compact states: the same bits with 16 tensors per dispatch as with one",
  GPU_TEST,
  async () => {
    for (const stateDtype of COMPACT) {
      const one = await withSlots(1, () => train(stateDtype, 3));
      const many = await withSlots(16, () => train(stateDtype, 3));
      assert.deepStrictEqual(many, one, stateDtype);
      const kinds = one.state.state.map((s) => s.buffers.expAvg.constructor.name);
      // 8bit: the tensors below min8bitSize (300) keep f32 moments.
      const want = stateDtype === "bf16"
        ? SIZES.map(() => "Uint16Array")
        : SIZES.map((n) => n < 300 ? "Float32Array" : "Uint8Array");
      assert.deepStrictEqual(kinds, want, stateDtype);
    }
  },
);

Deno.test(
  "compact states: a resumed run is the same bits as one that never stopped",
  GPU_TEST,
  async () => {
    for (const stateDtype of COMPACT) {
      const straight = await train(stateDtype, 4);
      const half = await train(stateDtype, 2);
      const resumed = await train(stateDtype, 4, half);
      assert.deepStrictEqual(resumed.state, straight.state, stateDtype);
      assert.deepStrictEqual(resumed.masters, straight.masters, stateDtype);
    }
  },
);

Deno.test(
  "8-bit states: a damaged scale or code, or another stateDtype, is refused by name",
  GPU_TEST,
  async () => {
    const p = Tensor.zeros([600]);
    const opt = new Adam([p], { stateDtype: "8bit", min8bitSize: 512 });
    p.grad = Tensor.full([600], 0.25);
    opt.step();
    const s = await opt.stateDict();
    const b = s.state[0].buffers;
    const withBuffer = (name: string, data: unknown): OptimizerStateDict => ({
      ...s,
      state: [{ ...s.state[0], buffers: { ...b, [name]: data as Float32Array } }],
    });
    const refused = (state: OptimizerStateDict, message: RegExp) =>
      assert.throws(() => opt.loadStateDict(state), message);
    refused(
      withBuffer("expAvgAbsmax", Float32Array.of(0.1, NaN, 0.1)),
      /buffer expAvgAbsmax holds 1 non-finite value\(s\)/,
    );
    refused(
      withBuffer("expAvgSqAbsmax", Float32Array.of(0.1, -1, 0.1)),
      /buffer expAvgSqAbsmax holds 1 negative value\(s\)/,
    );
    refused(
      withBuffer("expAvgAbsmax", new Float32Array(2)),
      /buffer expAvgAbsmax must be a Float32Array of 3 values, got a Float32Array of 2 values/,
    );
    refused(
      withBuffer("expAvg", new Float32Array(600)),
      /buffer expAvg must be a Uint8Array of 600 values, got a Float32Array of 600 values/,
    );
    refused(
      withBuffer("expAvgSq", new Uint8Array(599)),
      /buffer expAvgSq must be a Uint8Array of 600/,
    );
    const { expAvgAbsmax: _, ...noScale } = b;
    refused(
      { ...s, state: [{ ...s.state[0], buffers: noScale }] },
      /buffers \[expAvg,expAvgSq,expAvgSqAbsmax\], expected \[expAvg,expAvgSq,expAvgAbsmax,expAvgSqAbsmax\]/,
    );
    refused({ ...s, min8bitSize: 4096 }, /construct it with \{ min8bitSize: 4096 \}/);
    const f32 = new Adam([p]);
    assert.throws(
      () => f32.loadStateDict(s),
      /it holds stateDtype "8bit" moments, this optimizer keeps "f32": construct it with \{ stateDtype: "8bit" \}/,
    );
    // Nothing was loaded: the state is still the one saved.
    assert.deepStrictEqual(await opt.stateDict(), s);
    f32.dispose();
    opt.dispose();
  },
);

Deno.test(
  "compact states: an f32 state (a run PyTorch wrote back) loads quantized, within a code",
  GPU_TEST,
  async () => {
    const n = 1000;
    const p = Tensor.zeros([n]);
    const f32 = new AdamW([p]);
    const m = Float32Array.from(uniform(n, 8, -0.02, 0.02)),
      v = Float32Array.from(uniform(n, 9, 0, 1e-4));
    const plain = await f32.stateDict();
    const given = {
      ...plain,
      step: 7,
      state: [{ ...plain.state[0], buffers: { expAvg: m, expAvgSq: v } }],
    };
    for (const stateDtype of COMPACT) {
      const opt = new AdamW([p], {
        stateDtype,
        min8bitSize: stateDtype === "8bit" ? 0 : undefined,
      });
      opt.loadStateDict(given);
      const back = dequantizeStates(await opt.stateDict());
      assert.equal(back.step, 7);
      for (const [name, want] of [["expAvg", m], ["expAvgSq", v]] as const) {
        const got = back.state[0].buffers[name] as Float32Array;
        const scale = Math.max(...want.map(Math.abs));
        for (let i = 0; i < n; i++) {
          // 8bit: the map's steps are at most 1.4% of the block's absmax (around 1); bf16: 2⁻⁸ relative.
          const allowed = stateDtype === "8bit" ? 0.0071 * scale : 2 ** -8 * Math.abs(want[i]);
          assert.ok(
            Math.abs(got[i] - want[i]) <= allowed,
            `${stateDtype} ${name}[${i}]: ${got[i]} vs ${want[i]}`,
          );
        }
      }
      opt.dispose();
    }
    f32.dispose();
  },
);
