/**
 * Training-state files with Adam's compact moments: an AMP run with 8-bit
 * or bf16 AdamW states saved mid-accumulation resumes bit for bit; the file
 * holds the moments dequantized under PyTorch's names and their exact form
 * under `optimizer.compact.*`; a damaged scale or code, or a file of
 * another stateDtype, is refused by name; the PyTorch tools read the
 * dequantized moments as a plain torch.optim.AdamW state.
 */
import assert from "node:assert/strict";
import { AdamW, AmpTrainer, dequantizeStates, Linear, type StateDtype, Tensor } from "../../mod.ts";
import { loadTrainingState, saveTrainingState } from "../../files.ts";
import { decodeSafetensors } from "../../nn/mod.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { classifier, rewrite, type Run, snapshot, train } from "../helpers/training_state.ts";
import { runPython } from "../helpers/torch.ts";
import { assertClose, TOL } from "../helpers/assert.ts";
import { uniform } from "../helpers/reference.ts";

const TOOLS = new URL("../../examples/torch/", import.meta.url).pathname;

const dir = await Deno.makeTempDir();

/** The shared training-state run with AdamW keeping `stateDtype` moments (8bit: every tensor). */
function compactRun(stateDtype: StateDtype, seed = 3): Run {
  const model = classifier(seed);
  const optimizer = new AdamW(model.parameters(), {
    lr: 5e-3,
    stateDtype,
    ...(stateDtype === "8bit" && { min8bitSize: 64 }),
  });
  const trainer = new AmpTrainer(model, optimizer, {
    accumulationSteps: 2,
    scaler: { growthInterval: 2 },
  });
  return { model, optimizer, trainer };
}

Deno.test(
  "compact states: a training state saved mid-accumulation resumes bit for bit",
  GPU_TEST,
  async () => {
    for (const stateDtype of ["8bit", "bf16"] as const) {
      const path = `${dir}/${stateDtype}.safetensors`;
      const straight = compactRun(stateDtype);
      train(straight, 0, 5);
      await saveTrainingState(path, straight);
      train(straight, 5, 5);
      const resumed = compactRun(stateDtype, 99);
      await loadTrainingState(path, resumed);
      train(resumed, 5, 5);
      assert.deepStrictEqual(await snapshot(resumed), await snapshot(straight), stateDtype);
    }
  },
);

Deno.test(
  "compact states: the file holds PyTorch's dequantized moments and the exact ones",
  GPU_TEST,
  async () => {
    const path = `${dir}/layout.safetensors`;
    const run = compactRun("8bit");
    train(run, 0, 4);
    await saveTrainingState(path, run);
    const { entries, metadata } = decodeSafetensors(await Deno.readFile(path));
    const halfstep = JSON.parse(metadata.optimizer).halfstep;
    assert.deepStrictEqual(halfstep, {
      bias_correction: true,
      state_dtype: "8bit",
      min_8bit_size: 64,
    });
    const saved = await run.optimizer.stateDict();
    const plain = dequantizeStates(saved);
    for (const [i, p] of saved.state.entries()) {
      const torch = entries.get(`optimizer.state.${i}.exp_avg`)!;
      assert.equal(torch.dtype, "f32");
      assert.deepStrictEqual(
        new Float32Array(torch.data.slice().buffer),
        plain.state[i].buffers.expAvg,
      );
      const eightBit = p.buffers.expAvg instanceof Uint8Array;
      // The 16-element biases and BatchNorm tensors are below min8bitSize (64): f32 only.
      assert.equal(entries.has(`optimizer.compact.${i}.exp_avg`), eightBit, `param ${i}`);
      if (eightBit) {
        const codes = entries.get(`optimizer.compact.${i}.exp_avg`)!;
        assert.equal(codes.dtype, "i32");
        assert.deepStrictEqual(codes.data.subarray(0, p.buffers.expAvg.length), p.buffers.expAvg);
        assert.equal(entries.get(`optimizer.compact.${i}.exp_avg_sq_absmax`)!.dtype, "f32");
      }
    }
    assert.ok(saved.state.some((p) => p.buffers.expAvg instanceof Uint8Array));
  },
);

Deno.test(
  "compact states: a damaged scale or code, or another stateDtype, is refused by name",
  GPU_TEST,
  async () => {
    const path = `${dir}/damaged.safetensors`, out = `${dir}/damaged_out.safetensors`;
    const run = compactRun("8bit");
    train(run, 0, 4);
    await saveTrainingState(path, run);
    const refused = async (what: string, edit: Parameters<typeof rewrite>[2], message: RegExp) => {
      await rewrite(path, out, edit);
      const fresh = compactRun("8bit", 5);
      const before = await snapshot(fresh);
      await assert.rejects(() => loadTrainingState(out, fresh), message, what);
      assert.deepStrictEqual(await snapshot(fresh), before, `${what}: nothing was loaded`);
    };
    const scale = "optimizer.compact.0.exp_avg_absmax";
    await refused("a NaN scale", (f) => {
      const e = f.entries.get(scale)!;
      new Float32Array(e.data.buffer)[0] = NaN;
    }, /tensor "optimizer\.compact\.0\.exp_avg_absmax" holds 1 non-finite value/);
    await refused("a negative scale", (f) => {
      new Float32Array(f.entries.get(scale)!.data.buffer)[0] = -1;
    }, /parameter 0 .*: buffer expAvgAbsmax holds 1 negative value/);
    await refused("a scale of f16", (f) => {
      const e = f.entries.get(scale)!;
      f.entries.set(scale, {
        dtype: "f16",
        shape: e.shape,
        data: e.data.slice(0, e.data.length / 2),
      });
    }, /"optimizer\.compact\.0\.exp_avg_absmax" is f16 \[1\], not f32 \[blocks\]/);
    await refused("codes of the wrong shape", (f) => {
      const name = "optimizer.compact.0.exp_avg_sq", e = f.entries.get(name)!;
      f.entries.set(name, { ...e, shape: [e.shape[0] - 1], data: e.data.slice(4) });
    }, /"optimizer\.compact\.0\.exp_avg_sq" is i32 \[23\], not i32 \[24\]/);
    await refused("a missing scale", (f) => {
      f.entries.delete("optimizer.compact.0.exp_avg_sq_absmax");
    }, /"optimizer\.compact\.0\.exp_avg_sq_absmax" is missing/);
    const f32 = classifier(5);
    const f32Run = { model: f32, optimizer: new AdamW(f32.parameters()) };
    await assert.rejects(
      () => loadTrainingState(path, f32Run),
      /it holds stateDtype "8bit" moments, this optimizer keeps "f32"/,
    );
  },
);

/** Reads a halfstep run with the PyTorch tools, takes one torch.optim.AdamW step with the given gradients. */
const TORCH_STEP = `
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from halfstep_run import read_run, make_optimizer
run = read_run(sys.argv[2])
names, grads = json.loads(sys.stdin.read())
params = [torch.nn.Parameter(run["model"][n].clone()) for n in names]
optimizer = make_optimizer(params, run["optimizer"])
assert type(optimizer) is torch.optim.AdamW
for p, g in zip(params, grads):
    p.grad = torch.tensor(g, dtype=torch.float32).reshape(p.shape)
optimizer.step()
print(json.dumps({"compact": run["compact_states"], "params": [p.detach().flatten().tolist() for p in params]}))
`;

Deno.test(
  "compact states: the dequantized export takes one torch.optim.AdamW step equal to ours",
  GPU_TEST,
  async () => {
    const path = `${dir}/torch.safetensors`;
    const model = new Linear(80, 64, { seed: 4 });
    const named = [...model.namedParameters()];
    const opt = new AdamW(model.parameters(), { lr: 1e-2, stateDtype: "8bit" });
    const grads = (s: number) => named.map(([, p]) => uniform(p.size, 50 + s, -1, 1));
    for (let s = 0; s < 4; s++) {
      named.forEach(([, p], k) => {
        p.grad?.dispose();
        p.grad = Tensor.from(grads(s)[k], p.shape);
      });
      if (s === 3) await saveTrainingState(path, { model, optimizer: opt });
      opt.step();
    }
    const state = await opt.stateDict();
    assert.ok(state.state[0].buffers.expAvg instanceof Uint8Array, "the weight keeps 8-bit states");
    const out = JSON.parse(
      await runPython(
        ["-c", TORCH_STEP, TOOLS, path],
        JSON.stringify([named.map(([n]) => n), grads(3).map((g) => [...g])]),
      ),
    );
    assert.equal(out.compact, "8bit");
    for (const [k, [name, p]] of named.entries()) {
      assertClose(await p.read(), out.params[k], TOL.f32, name);
    }
    opt.dispose();
  },
);
