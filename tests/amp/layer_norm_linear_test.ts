/**
 * `layerNormLinear(x, W, { norm })`: results and every gradient equal
 * `linear(layerNorm(x, norm), W)` bit for bit (LayerNorm and linear are each
 * checked against f64 in their own tests), in f32 and under autocast, while
 * backward keeps x instead of the normalised rows; and a TransformerBlock,
 * which now runs its two LayerNorms this way, trains exactly as the same
 * modules composed one by one.
 */
import assert from "node:assert/strict";
import {
  add,
  autocast,
  backward,
  DTypeError,
  layerNorm,
  layerNormLinear,
  linear,
  RandomGenerator,
  sum,
  Tensor,
  TransformerBlock,
} from "../../mod.ts";
import { MasterWeights } from "../../amp/master_weights.ts";
import { dispatchedKernels, gpu, GPU_TEST } from "../helpers/gpu.ts";

interface Case {
  shape: number[];
  out: number;
  normWeight: boolean;
  normBias: boolean;
  bias: boolean;
  activation: "none" | "relu";
}

const CASES: Case[] = [
  { shape: [7, 33], out: 5, normWeight: true, normBias: true, bias: true, activation: "none" },
  {
    shape: [2, 3, 65],
    out: 129,
    normWeight: true,
    normBias: false,
    bias: false,
    activation: "relu",
  },
  { shape: [1, 16], out: 1, normWeight: false, normBias: false, bias: true, activation: "none" },
];

/** Output and every gradient, read back, from the fused op or the composition. */
async function run(c: Case, fused: boolean, amp: boolean): Promise<(Float32Array | Int32Array)[]> {
  const rng = new RandomGenerator(c.shape.reduce((a, b) => a * b) + c.out);
  const inF = c.shape.at(-1)!;
  const grad = { requiresGrad: true };
  const x = Tensor.from(rng.uniform(c.shape.reduce((a, b) => a * b), -2, 2), c.shape, grad);
  const nw = c.normWeight ? Tensor.from(rng.uniform(inF, 0.5, 1.5), [inF], grad) : null;
  const nb = c.normBias ? Tensor.from(rng.uniform(inF, -0.5, 0.5), [inF], grad) : null;
  const w = Tensor.from(rng.uniform(c.out * inF, -0.5, 0.5), [c.out, inF], grad);
  const b = c.bias ? Tensor.from(rng.uniform(c.out, -0.5, 0.5), [c.out], grad) : null;
  const norm = { weight: nw, bias: nb };
  const y = autocast(
    () =>
      fused
        ? layerNormLinear(x, w, { norm, bias: b, activation: c.activation })
        : linear(layerNorm(x, norm), w, { bias: b, activation: c.activation }),
    { enabled: amp },
  );
  const g = Tensor.from(
    rng.uniform(c.shape.slice(0, -1).reduce((a, v) => a * v, 1) * c.out, -1, 1),
    [...c.shape.slice(0, -1), c.out],
    { dtype: y.dtype },
  );
  backward(y, { gradient: g });
  const out = [await y.read()];
  for (const t of [x, nw, nb, w, b]) if (t) out.push(await t.grad!.read());
  for (const t of [x, nw, nb, w, b, g, y]) t?.dispose();
  return out;
}

Deno.test({
  name:
    "layerNormLinear: equals linear(layerNorm(x)) bit for bit, f32 and autocast, with and without parameters",
  ...GPU_TEST,
  async fn() {
    for (const amp of [false, true]) {
      for (const c of CASES) {
        const label = `${JSON.stringify(c)} amp=${amp}`;
        assert.deepEqual(await run(c, true, amp), await run(c, false, amp), label);
      }
    }
  },
});

Deno.test({
  name: "layerNormLinear under autocast: no cast between the f32 LayerNorm and the f16 product, " +
    "forward or backward" + (gpu.f16 ? "" : " (ignored: the adapter has no shader-f16)"),
  ignore: !gpu.f16,
  ...GPU_TEST,
  fn() {
    const rng = new RandomGenerator(3);
    const grad = { requiresGrad: true };
    const x = Tensor.from(rng.uniform(5 * 24, -1, 1), [5, 24], grad);
    const nw = Tensor.from(rng.uniform(24, 0.5, 1.5), [24], grad);
    const w = Tensor.from(rng.uniform(8 * 24, -0.5, 0.5), [8, 24], grad);
    // Master weights hold w's f16 working copy, so no cast of w is expected either.
    const masterWeights = new MasterWeights([w]);
    let y!: Tensor;
    const forward = dispatchedKernels(() => {
      y = autocast(() => layerNormLinear(x, w, { norm: { weight: nw } }), { masterWeights });
    });
    assert.equal(y.dtype, "f16");
    const g = Tensor.full(y.shape, 0.5, { dtype: "f16" });
    const backwardKernels = dispatchedKernels(() => backward(y, { gradient: g }));
    for (const key of [...forward, ...backwardKernels]) {
      assert.ok(!key.startsWith("unary{"), `a cast was dispatched: ${key}`);
    }
    assert.equal(x.grad!.dtype, "f32");
    assert.equal(w.grad!.dtype, "f32");
    for (const t of [x, nw, w, y, g, ...[x, nw, w].map((t) => t.grad)]) t?.dispose();
    masterWeights.dispose();
  },
});

Deno.test({
  name:
    "layerNormLinear: backward normalises the rows again from the forward's saved statistics, " +
    "with no second statistics pass",
  ...GPU_TEST,
  fn() {
    const rng = new RandomGenerator(4);
    const grad = { requiresGrad: true };
    const x = Tensor.from(rng.uniform(9 * 40, -1, 1), [9, 40], grad);
    const w = Tensor.from(rng.uniform(6 * 40, -0.5, 0.5), [6, 40], grad);
    const y = layerNormLinear(x, w, { norm: {} });
    const loss = sum(y);
    const keys = dispatchedKernels(() => backward(loss));
    const norms = keys.filter((k) => k.startsWith("layer_norm_forward"));
    assert.equal(norms.length, 1, `LayerNorm passes in backward: ${norms.join(" | ")}`);
    assert.ok(norms[0].includes("saved=true"), `the recompute computed statistics: ${norms[0]}`);
    for (const t of [x, w, y, loss, x.grad, w.grad]) t?.dispose();
  },
});

Deno.test({
  name: "layerNormLinear: keeps x, not the normalised rows, for backward",
  ...GPU_TEST,
  fn() {
    const rows = 64, inF = 256, outF = 8;
    const held = (fused: boolean) => {
      const x = Tensor.from(new RandomGenerator(1).uniform(rows * inF, -1, 1), [rows, inF], {
        requiresGrad: true,
      });
      const w = Tensor.from(new RandomGenerator(2).uniform(outF * inF, -1, 1), [outF, inF], {
        requiresGrad: true,
      });
      const before = gpu.memoryStats().allocatedBytes;
      let y: Tensor;
      if (fused) y = layerNormLinear(x, w, { norm: {} });
      else {
        const n = layerNorm(x);
        y = linear(n, w);
        n.dispose();
      }
      const bytes = gpu.memoryStats().allocatedBytes - before;
      const loss = sum(y);
      backward(loss);
      for (const t of [x, w, y, loss]) t.dispose();
      return bytes;
    };
    const composed = held(false), fused = held(true);
    assert.equal(composed - fused, rows * inF * 4, `composed ${composed} B, fused ${fused} B`);
  },
});

Deno.test({
  name: "layerNormLinear: a TransformerBlock trains exactly as its modules composed one by one",
  ...GPU_TEST,
  async fn() {
    const block = new TransformerBlock(32, 4, { seed: 7 });
    const x = Tensor.from(new RandomGenerator(8).uniform(2 * 9 * 32, -1, 1), [2, 9, 32]);
    const composed = (input: Tensor) => {
      const a = block.attention.forward(block.norm1.forward(input));
      const x1 = add(input, a);
      return add(x1, block.fc2.forward(block.fc1.forward(block.norm2.forward(x1))));
    };
    for (const amp of [false, true]) {
      const step = async (viaBlock: boolean) => {
        const loss = autocast(() => sum(viaBlock ? block.forward(x) : composed(x)), {
          enabled: amp,
        });
        backward(loss);
        const out = [await loss.read()];
        for (const p of block.parameters()) out.push(await p.grad!.read());
        block.zeroGrad();
        loss.dispose();
        return out;
      };
      assert.deepEqual(await step(true), await step(false), `amp ${amp}`);
    }
    const bad = Tensor.from([1, 2, 3], [3]);
    assert.throws(
      () => layerNormLinear(x, block.fc1.weight, { norm: { weight: bad } }),
      (e: unknown) =>
        e instanceof DTypeError && /layerNorm: weight must be f32 \[32\]/.test(e.message),
    );
  },
});
