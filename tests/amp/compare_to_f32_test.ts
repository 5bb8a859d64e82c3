/**
 * compareToF32: the op known to lose precision in f16 (a LayerNorm over
 * values with a large offset) ranks first, ops that ran in f32 in both runs
 * show no drift, errors match an f64 computation over the outputs read back,
 * and the model's gradients and generators are left as they were.
 */
import assert from "node:assert/strict";
import {
  autocast,
  compareToF32,
  Dropout,
  LayerNorm,
  Linear,
  mean,
  noGrad,
  RandomGenerator,
  scale,
  Sequential,
  square,
  Tensor,
} from "../../mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { uniform } from "../helpers/reference.ts";

const noF16 = gpu.f16 ? "" : " (ignored: no shader-f16)";

Deno.test({
  name: "compareToF32: a LayerNorm over values offset by 1000 ranks first by the error it " +
    `adds; ops f32 in both runs (Dropout's mask replayed) drift 0${noF16}`,
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    const rng = new RandomGenerator(1);
    const model = new Sequential(
      new Dropout(0.25, { seed: new RandomGenerator(2) }),
      new Linear(8, 16, { seed: rng }),
      new LayerNorm(16),
    );
    // The bias puts the Linear's output near 1000, where f16's spacing is 0.5: the
    // LayerNorm, which subtracts that offset, sees its f16 input's rounding magnified.
    const bias = model.stateDict().get("1.bias")!;
    bias.writeBytes(new Uint8Array(new Float32Array(16).fill(1000).buffer));
    const x = Tensor.from(uniform(4 * 8, 3), [4, 8]);
    const dropout = (model.layers[0] as Dropout).generator;
    const before = dropout.state();
    const report = await compareToF32(model, () => mean(square(model.forward(scale(x, 2)))));
    assert.deepEqual(dropout.state(), before, "the generator is left as it was");
    for (const p of model.parameters()) assert.equal(p.grad, null, "gradients left as they were");
    assert.equal(report.ops[0].name, "2");
    assert.equal(report.ops[0].op, "layer_norm");
    assert.equal(report.ops[0].dtype, "f16");
    const linear = report.ops.find((d) => d.name === "1" && d.op === "linear")!;
    assert.ok(linear.relativeError > 0 && linear.relativeError < 2e-3, `${linear.relativeError}`);
    assert.ok(report.ops[0].relativeError > 0.1, `${report.ops[0].relativeError}`);
    assert.equal(
      report.ops[0].inputError,
      linear.relativeError,
      "its input is the Linear's output",
    );
    // The square of the LayerNorm's output drifts more, but inherits most of it.
    const squared = report.ops.find((d) => d.name === "square:0")!;
    assert.ok(squared.relativeError > squared.addedError && squared.addedError > 0);
    // f32 in both runs: the input's scaling, and Dropout, whose mask is drawn again
    // from the same generator state.
    for (const name of ["scale:0", "0"]) {
      const d = report.ops.find((d) => d.name === name)!;
      assert.deepEqual([d.relativeError, d.maxAbsError], [0, 0], name);
    }
    // The LayerNorm's drift against f64 sums over its outputs computed here, in both precisions.
    const output = async (mixed: boolean) => {
      dropout.setState(before);
      const run = () => noGrad(() => model.forward(scale(x, 2)));
      return await (mixed ? autocast(run) : run()).read();
    };
    const [f32, amp] = [await output(false), await output(true)];
    dropout.setState(before);
    let diff = 0, norm = 0;
    f32.forEach((v, i) => {
      diff += (amp[i] - v) ** 2;
      norm += v * v;
    });
    assert.ok(Math.abs(report.ops[0].relativeError - Math.sqrt(diff / norm)) < 1e-12);
    assert.deepEqual(
      report.params.map((p) => p.name).sort(),
      ["1.bias", "1.weight", "2.bias", "2.weight"],
    );
    model.dispose();
    x.dispose();
  },
});
