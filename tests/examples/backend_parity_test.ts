/**
 * One AMP training step of the MNIST MLP and of the tiny GPT gives the same
 * loss, loss scale and weight updates on Dawn as on the builtin backend, both
 * devices in one process (the suite's Dawn pass: Mesa 26's lavapipe serves
 * Dawn and Deno's own WebGPU alike). Both run the same WGSL, and every kernel
 * is checked against its f64 reference elsewhere in the suite on each backend;
 * this checks what neither reference sees: that the backend (its compiler,
 * Tint or naga, and its runtime) changes no result of a whole step — subnormals,
 * f16 stores, atomics, the loss scaler's decisions made on the GPU.
 */
import assert from "node:assert/strict";
import {
  Adam,
  AdamW,
  AmpTrainer,
  crossEntropy,
  type Module,
  type Optimizer,
  RandomGenerator,
  Tensor,
} from "../../mod.ts";
import { type Gpu, initGpu, setDefaultGpu } from "../../gpu/mod.ts";
import { mnistMlp } from "../../examples/mnist/model.ts";
import { Gpt } from "../../models/mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";

const ON_DAWN = gpu.backend === "dawn";

/**
 * Adam's eps, raised from 1e-8 so that one step's update g / (|g| + eps) is a
 * smooth function of the gradient: with 1e-8 it is ±lr for every |g| above
 * 1e-6, and a gradient near zero whose sign the two compilers' roundings
 * decide would move a weight by 2·lr. Typical |g| here is 1e-4 to 1e-2.
 */
const EPS = 1e-3;

/** What one step gave: the loss, the scale after it, and each parameter's update w' − w. */
interface Step {
  loss: number;
  scale: number;
  skipped: number;
  updates: Map<string, Float32Array>;
}

/** Builds a model, its optimizer and a batch on `device`, runs one AMP step, and reads it back. */
async function stepOn(
  device: Gpu,
  build: () => { model: Module; optimizer: Optimizer; loss: () => Tensor },
): Promise<Step> {
  setDefaultGpu(device);
  try {
    const { model, optimizer, loss } = build();
    const before = new Map<string, Float32Array>();
    for (const [name, p] of model.namedParameters()) {
      before.set(name, await p.read() as Float32Array);
    }
    const trainer = new AmpTrainer(model, optimizer);
    const value = trainer.step(loss);
    const step: Step = {
      loss: await value.item(),
      scale: await trainer.scaler.getScale(),
      skipped: await trainer.scaler.skippedSteps(),
      updates: new Map(),
    };
    for (const [name, p] of model.namedParameters()) {
      const after = await p.read() as Float32Array;
      step.updates.set(name, after.map((w, i) => w - before.get(name)![i]));
    }
    value.dispose();
    trainer.dispose();
    model.dispose();
    return step;
  } finally {
    setDefaultGpu(gpu);
  }
}

/** The Euclidean norm, in f64. */
function norm(v: Float32Array): number {
  let squares = 0;
  for (const x of v) squares += x * x;
  return Math.sqrt(squares);
}

/**
 * Dawn's step against the builtin's. Tolerances: the two compilers may
 * contract a·b + c into an FMA or not and round exp, log and tanh
 * differently, each about 1 f32 ulp; an activation stored in f16 then rounds
 * to a neighbouring f16 at most (2⁻¹¹ relative), and a few layers add up to
 * ~1e-3 of the loss and of each update's norm. 1e-2 leaves room for that,
 * while a wrong kernel (a lost term, flushed subnormals, a torn f16 store, a
 * skipped step) is off by O(1).
 */
function assertSameStep(dawn: Step, builtin: Step, what: string): void {
  assert.ok(
    Math.abs(dawn.loss - builtin.loss) <= 1e-3 * Math.abs(builtin.loss),
    `${what}: loss ${dawn.loss} on Dawn, ${builtin.loss} builtin`,
  );
  assert.equal(dawn.scale, builtin.scale, `${what}: loss scale`);
  assert.equal(dawn.skipped, 0, `${what}: no step skipped`);
  assert.equal(builtin.skipped, 0);
  for (const [name, reference] of builtin.updates) {
    const got = dawn.updates.get(name)!;
    const size = norm(reference);
    assert.ok(size > 0, `${what}: ${name} was updated`);
    const off = norm(got.map((u, i) => u - reference[i]));
    assert.ok(
      off <= 1e-2 * size,
      `${what}: ${name}'s update differs by ${off.toExponential(2)} (norm ${
        size.toExponential(2)
      })`,
    );
  }
}

/** The MNIST MLP (784-256-256-10) on a batch of 64 random images and labels. */
function mlp() {
  const model = mnistMlp(0);
  const data = new RandomGenerator(11);
  const x = Tensor.from(data.uniform(64 * 784), [64, 784]);
  const labels = Array.from(data.uniform(64), (u) => Math.floor(u * 10));
  const optimizer = new Adam(model.parameters(), { lr: 2e-3, eps: EPS });
  return { model, optimizer, loss: () => crossEntropy(model.forward(x), labels) };
}

/** The tiny GPT (2 blocks, dim 32, 4 heads, context 16) on 8 random windows of 27 symbols. */
function gpt() {
  const model = new Gpt({ vocab: 27, context: 16, layers: 2, dim: 32, heads: 4, seed: 3 });
  const draws = new RandomGenerator(12).uniform(2 * 8 * 16);
  const ids = Array.from(draws, (u) => Math.floor(u * 27));
  const x = Tensor.from(ids.slice(0, 8 * 16), [8, 16], { dtype: "i32" });
  const targets = ids.slice(8 * 16);
  const optimizer = new AdamW(model.parameters(), { lr: 1e-2, weightDecay: 0.01, eps: EPS });
  return { model, optimizer, loss: () => crossEntropy(model.forward(x), targets) };
}

Deno.test({
  name: "backends: one AMP step of the MNIST MLP and of the tiny GPT is the same on Dawn as on " +
    "the builtin backend" + (ON_DAWN ? "" : " (ignored: the suite runs on the builtin backend)"),
  ignore: !ON_DAWN,
  ...GPU_TEST,
  async fn() {
    const builtin = await initGpu({
      backend: "builtin",
      matmulTiling: "default",
      setDefault: false,
    });
    try {
      assert.equal(builtin.backend, "builtin");
      for (const [what, build] of [["MLP", mlp], ["GPT", gpt]] as const) {
        const dawnStep = await stepOn(gpu, build);
        const builtinStep = await stepOn(builtin, build);
        assertSameStep(dawnStep, builtinStep, what);
      }
    } finally {
      builtin.destroy();
    }
  },
});
