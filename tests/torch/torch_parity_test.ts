/**
 * halfstep against results PyTorch itself produced: `tests/fixtures/torch/`
 * holds files written by torch 2.13 and safetensors' own writer, and the
 * script that made them (`make_fixtures.py`). Nothing here was produced by
 * halfstep.
 */
import assert from "node:assert/strict";
import { backward, batchNorm, batchNormCounter, gelu, mul, sum, Tensor } from "../../gpu/mod.ts";
import {
  AdaptiveAvgPool2d,
  AvgPool2d,
  BatchNorm,
  BatchNorm2d,
  Conv2d,
  crossEntropy,
  Embedding,
  Flatten,
  GELU,
  LayerNorm,
  Linear,
  MaxPool2d,
  ReLU,
  Sequential,
} from "../../nn/mod.ts";
import { SGD } from "../../optim/mod.ts";
import { loadModule, saveModule } from "../../files.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { uniform } from "../helpers/reference.ts";
import { assertClose, TOL } from "../helpers/assert.ts";
import { runPython } from "../helpers/torch.ts";

const FIXTURES = new URL("../fixtures/torch/", import.meta.url);
const parity = JSON.parse(await Deno.readTextFile(new URL("parity.json", FIXTURES)));
const stateValues: Record<string, { dtype: string; shape: number[]; values: number[] }> = JSON
  .parse(await Deno.readTextFile(new URL("state_values.json", FIXTURES)));

/** The halfstep twin of the fixture's torch.nn.Sequential (same names, shapes and dtypes). */
function twin(): Sequential {
  return new Sequential(
    new Embedding(6, 4, { seed: 1 }),
    new Linear(4, 3, { seed: 2 }),
    new LayerNorm(3),
    new BatchNorm(3),
    new Linear(3, 2, { seed: 3 }),
  );
}

/** x rounded to bfloat16 (round to nearest, ties to even), from the f32 bit pattern. */
function bf16(x: number): number {
  const bits = new Uint32Array(new Float32Array([x]).buffer)[0];
  const rounded = (bits + 0x7fff + ((bits >>> 16) & 1)) & 0xffff0000;
  return new Float32Array(new Uint32Array([rounded >>> 0]).buffer)[0];
}

const ROUND: Record<string, (x: number) => number> = {
  f32: Math.fround,
  f16: (x) => new Float16Array([x])[0],
  bf16,
};

Deno.test({
  name: "torch parity: GELU exact and tanh, values and derivatives, large |x| and near 0",
  ...GPU_TEST,
  async fn() {
    for (const approximate of ["none", "tanh"] as const) {
      const ref = parity[`gelu_${approximate}`];
      const n = ref.x.length;
      const x = Tensor.from(ref.x, [n], { requiresGrad: true });
      const y = gelu(x, { approximate });
      // Near 0 GELU(x) ≈ x/2: a relative tolerance keeps 1e-6 inputs honest.
      assertClose(await y.read(), ref.y, { atol: 1e-12, rtol: 1e-5 }, `gelu ${approximate}`);
      backward(y, { gradient: Tensor.full([n], 1) });
      assertClose(
        await x.grad!.read(),
        ref.dx,
        { atol: 1e-12, rtol: 1e-5 },
        `dgelu ${approximate}`,
      );
    }
  },
});

Deno.test({
  name: "torch parity: cross_entropy with ignore_index, class weights and label smoothing",
  ...GPU_TEST,
  async fn() {
    const ce = parity.cross_entropy;
    const rows = ce.targets.length, classes = ce.logits.length / rows;
    for (const c of ce.cases) {
      const logits = Tensor.from(ce.logits, [rows, classes], { requiresGrad: true });
      const loss = crossEntropy(logits, ce.targets, {
        reduction: c.reduction,
        labelSmoothing: c.smoothing,
        ignoreIndex: ce.ignore_index,
        ...(c.weighted && { weight: ce.weight }),
      });
      const label = `weighted=${c.weighted} ε=${c.smoothing} ${c.reduction}`;
      assertClose(await loss.read(), c.loss, TOL.f32, label);
      const ones = c.reduction === "none" ? { gradient: Tensor.full([rows], 1) } : {};
      backward(loss, ones);
      assertClose(await logits.grad!.read(), c.dlogits, TOL.f32, `${label} dlogits`);
    }
    const [allIgnored] = await crossEntropy(
      Tensor.from(ce.logits.slice(0, 2 * classes), [
        2,
        classes,
      ]),
      [-100, -100],
    ).read();
    assert.equal(Number.isNaN(allIgnored), ce.all_ignored_mean_is_nan);
  },
});

Deno.test({
  name: "torch parity: BatchNorm1d(momentum=None) keeps the cumulative average and counts batches",
  ...GPU_TEST,
  async fn() {
    const { batches, trace } = parity.batch_norm_cumulative;
    const bn = new BatchNorm(3, { momentum: null });
    // The functional op without a counter of the caller's keeps the same statistics.
    const runningMean = Tensor.zeros([3]), runningVar = Tensor.full([3], 1);
    for (const [i, values] of batches.entries()) {
      const x = Tensor.from(values, [values.length / 3, 3]);
      bn.forward(x).dispose();
      batchNorm(x, { runningMean, runningVar, training: true, momentum: null }).dispose();
      x.dispose();
      assertClose(await bn.runningMean.read(), trace[i].running_mean, TOL.f32, `mean ${i}`);
      assertClose(await bn.runningVar.read(), trace[i].running_var, TOL.f32, `var ${i}`);
      assert.equal((await bn.numBatchesTracked.read())[0], trace[i].num_batches_tracked);
      assertClose(await runningMean.read(), trace[i].running_mean, TOL.f32, `batchNorm mean ${i}`);
      assertClose(await runningVar.read(), trace[i].running_var, TOL.f32, `batchNorm var ${i}`);
      const count = await batchNormCounter(runningMean)!.item();
      assert.equal(count, trace[i].num_batches_tracked);
    }
    // Eval mode neither moves the statistics nor counts.
    bn.training = false;
    bn.forward(Tensor.from(batches[0], [batches[0].length / 3, 3])).dispose();
    assert.equal((await bn.numBatchesTracked.read())[0], trace.at(-1).num_batches_tracked);
    bn.dispose();
  },
});

Deno.test({
  name: "torch parity: loadModule reads PyTorch's f32, f16 and bf16 safetensors files exactly",
  ...GPU_TEST,
  async fn() {
    for (const dtype of ["f32", "f16", "bf16"]) {
      const model = twin();
      await loadModule(new URL(`state_${dtype}.safetensors`, FIXTURES).pathname, model);
      const state = model.stateDict();
      assert.deepEqual([...state.keys()].sort(), Object.keys(stateValues).sort());
      for (const [name, expected] of Object.entries(stateValues)) {
        const t = state.get(name)!;
        assert.deepEqual(t.shape, expected.shape, name);
        const values = Array.from(await t.read());
        if (expected.dtype === "torch.int64") {
          assert.equal(t.dtype, "i32", `${name}: int64 counters load as i32`);
          assert.deepEqual(values, expected.values, name);
        } else {
          // The file holds the f32 values rounded to its dtype; loading widens exactly.
          assert.equal(t.dtype, "f32", `${name} loads into fp32 parameters`);
          assert.deepEqual(values, expected.values.map(ROUND[dtype]), `${dtype} ${name}`);
        }
      }
      model.dispose();
    }
  },
});

Deno.test({
  name: "torch parity: the loaded model gives PyTorch's eval-mode output",
  ...GPU_TEST,
  async fn() {
    const model = twin();
    await loadModule(new URL("state_f32.safetensors", FIXTURES).pathname, model);
    model.eval();
    const { ids, output } = parity.sequential_eval;
    const y = model.forward(Tensor.from(ids, [ids.length], { dtype: "i32" }));
    assertClose(await y.read(), output, TOL.f32, "Sequential output");
    model.dispose();
  },
});

/** The halfstep twin of twin_model.py's cnn_model(). */
function cnnTwin(): Sequential {
  return new Sequential(
    new Conv2d(2, 4, 3, { padding: 1 }),
    new BatchNorm2d(4),
    new ReLU(),
    new MaxPool2d({ kernelSize: 3, stride: 2, padding: 1 }),
    new Conv2d(4, 6, [3, 2], { padding: "same", dilation: [1, 2], groups: 2, bias: false }),
    new AvgPool2d({ kernelSize: 2, stride: 1, padding: 1, countIncludePad: false }),
    new Conv2d(6, 6, 3, { stride: 2, groups: 6 }),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear(6, 3),
  );
}

Deno.test({
  name: "torch parity: a CNN (conv padding/groups/dilation/same, BatchNorm2d, pools) loaded " +
    "from PyTorch gives its outputs, gradients and running statistics",
  ...GPU_TEST,
  async fn() {
    const ref = parity.cnn;
    const model = cnnTwin();
    await loadModule(new URL("state_cnn.safetensors", FIXTURES).pathname, model);
    const x = Tensor.from(ref.x, [2, 2, 9, 9], { requiresGrad: true });
    const y = model.forward(x);
    assertClose(await y.read(), ref.train_out, TOL.f32, "train-mode output");
    backward(sum(mul(y, Tensor.from(ref.r, [2, 3]))));
    assertClose(await x.grad!.read(), ref.dx, TOL.f32, "input gradient");
    for (const [name, p] of model.namedParameters()) {
      assertClose(await p.grad!.read(), ref.grads[name], TOL.f32, `${name} gradient`);
    }
    const state = model.stateDict();
    for (const [name, values] of Object.entries(ref.running as Record<string, number[]>)) {
      assertClose(await state.get(name)!.read(), values, TOL.f32, name);
    }
    model.eval();
    assertClose(
      await model.forward(Tensor.from(ref.x, [2, 2, 9, 9])).read(),
      ref.eval_out,
      TOL.f32,
      "eval",
    );
    model.dispose();
  },
});

/** A safetensors header: name → { dtype, shape } (offsets left out), without metadata. */
async function header(path: string): Promise<Record<string, { dtype: string; shape: number[] }>> {
  const bytes = await Deno.readFile(path);
  const length = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  const parsed = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + length)));
  delete parsed.__metadata__;
  return Object.fromEntries(
    Object.entries(parsed as Record<string, { dtype: string; shape: number[] }>)
      .map(([name, e]) => [name, { dtype: e.dtype, shape: e.shape }]),
  );
}

Deno.test({
  name: "torch parity: saveModule writes PyTorch's names, shapes and dtypes (counters as I32)",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      const model = twin();
      const ours = `${dir}/twin.safetensors`;
      await saveModule(ours, model);
      const theirs = await header(new URL("state_f32.safetensors", FIXTURES).pathname);
      // PyTorch's int64 num_batches_tracked is an i32 here: WGSL has no 64-bit integers,
      // and load_state_dict copies it into the int64 buffer with a cast.
      theirs["3.num_batches_tracked"].dtype = "I32";
      assert.deepEqual(await header(ours), theirs);
      // And the file round-trips into a fresh twin.
      const copy = twin();
      await loadModule(ours, copy);
      for (const [name, t] of model.stateDict()) {
        assert.deepEqual(await copy.stateDict().get(name)!.read(), await t.read(), name);
      }
      model.dispose();
      copy.dispose();
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

/**
 * halfstep twins of sequential_twins.py, written as torch.nn.Sequential is:
 * activations as their own layers (halfstep fuses them into the Linear and
 * Conv2d kernels), so the names are PyTorch's (`0.*`, `2.*`, `4.*`).
 */
const SEQUENTIAL_TWINS = {
  mlp: () =>
    new Sequential(
      new Linear(20, 32),
      new ReLU(),
      new Linear(32, 32),
      new ReLU(),
      new Linear(32, 10),
    ),
  cnn: () =>
    new Sequential(
      new Conv2d(1, 4, 3, { padding: 1 }),
      new ReLU(),
      new MaxPool2d(2),
      new Conv2d(4, 8, 3, { padding: 1 }),
      new BatchNorm2d(8),
      new ReLU(),
      new MaxPool2d(2),
      new Flatten(),
      new Linear(8 * 2 * 2, 16),
      new GELU(),
      new Linear(16, 10),
    ),
};
const sequentialRef = JSON.parse(
  await Deno.readTextFile(new URL("sequential.json", FIXTURES)),
);
/** Within 1e-5 of PyTorch's float32 eval output (the bar). */
const EVAL_TOL = { atol: 1e-5, rtol: 1e-5 };

Deno.test({
  name: "torch parity: Sequential(Linear, ReLU, ...) and a Conv2d/ReLU/GELU CNN load PyTorch's " +
    "files, give its eval outputs within 1e-5 and save PyTorch's names and shapes",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      for (const [kind, make] of Object.entries(SEQUENTIAL_TWINS)) {
        const file = new URL(`state_seq_${kind}.safetensors`, FIXTURES).pathname;
        const model = make();
        await loadModule(file, model);
        model.eval();
        const { x, shape, y } = sequentialRef[kind];
        const out = model.forward(Tensor.from(x, shape));
        assertClose(await out.read(), y, EVAL_TOL, `${kind} eval output`);
        // The file halfstep writes has exactly the keys and shapes strict loading checks.
        await saveModule(`${dir}/${kind}.safetensors`, model);
        const theirs = await header(file);
        for (const e of Object.values(theirs)) if (e.dtype === "I64") e.dtype = "I32";
        assert.deepEqual(await header(`${dir}/${kind}.safetensors`), theirs, kind);
        model.dispose();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

const size = (shape: number[]) => shape.reduce((a, b) => a * b, 1);

Deno.test({
  name: "torch parity: a trained halfstep Sequential loads with load_state_dict(strict=True) " +
    "into its torch.nn twin, eval outputs within 1e-5",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      for (const [kind, make] of Object.entries(SEQUENTIAL_TWINS)) {
        const model = make();
        const { shape } = sequentialRef[kind];
        // A few training steps: the weights and running statistics are halfstep's own.
        const optimizer = new SGD(model.parameters(), { lr: 0.1 });
        for (let i = 0; i < 3; i++) {
          const batch = Tensor.from(uniform(size(shape), i), shape);
          const loss = sum(mul(model.forward(batch), model.forward(batch)));
          backward(loss);
          optimizer.step();
          model.zeroGrad();
        }
        const path = `${dir}/${kind}.safetensors`, inputPath = `${dir}/${kind}.json`;
        await saveModule(path, model);
        const x = Array.from(uniform(size(shape), 9));
        await Deno.writeTextFile(inputPath, JSON.stringify({ x, shape }));
        model.eval();
        const ours = await model.forward(Tensor.from(x, shape)).read();
        const script = new URL("load_sequential_in_torch.py", FIXTURES).pathname;
        const theirs = JSON.parse(await runPython([script, kind, path, inputPath]));
        assert.deepEqual(theirs.keys.sort(), [...model.stateDict().keys()].sort());
        assertClose(ours, theirs.y, EVAL_TOL, `${kind}: PyTorch's eval output of halfstep's file`);
        optimizer.dispose();
        model.dispose();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
