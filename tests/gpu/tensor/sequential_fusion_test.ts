/**
 * Sequential written as torch.nn.Sequential — Linear, ReLU, Linear — runs the
 * ReLU in the Linear's epilogue (and a Conv2d's), and a GELU before a Linear
 * as its input GELU, keeping PyTorch's layer indices: the same bits forward
 * and backward as running every layer on its own, with fewer kernels, and
 * checkpointing still works.
 */
import assert from "node:assert/strict";
import { autocast } from "../../../amp/mod.ts";
import { mean, square, Tensor, tidy } from "../../../gpu/mod.ts";
import { RandomGenerator } from "../../../gpu/tensor/random.ts";
import {
  Conv2d,
  Dropout,
  Flatten,
  GELU,
  LayerNorm,
  Linear,
  MaxPool2d,
  ReLU,
  Sequential,
} from "../../../nn/mod.ts";
import { dispatchedKernels, gpu, GPU_TEST } from "../../helpers/gpu.ts";

function mlp(): Sequential {
  const init = new RandomGenerator(5);
  return new Sequential(
    new Linear(12, 16, { seed: init }),
    new ReLU(),
    new Linear(16, 16, { seed: init }),
    new GELU(),
    new Linear(16, 16, { seed: init }),
    new ReLU(),
    new Dropout(0.2, { seed: new RandomGenerator(6) }),
    new GELU({ approximate: "tanh" }),
    new Linear(16, 16, { seed: init }),
    new ReLU(),
    new LayerNorm(16),
    new Linear(16, 5, { seed: init }),
  );
}

function cnn(): Sequential {
  const init = new RandomGenerator(7);
  return new Sequential(
    new Conv2d(2, 4, 3, { padding: 1, seed: init }),
    new ReLU(),
    new MaxPool2d(2),
    new Conv2d(4, 4, 3, { padding: 1, groups: 2, seed: init }),
    new ReLU(),
    new Flatten(),
    new Linear(36, 6, { seed: init }),
    new ReLU(),
    new Linear(6, 3, { seed: init }),
  );
}

const inputs = {
  mlp: () => Tensor.from(new RandomGenerator(8).uniform(10 * 12, -2, 2), [10, 12]),
  cnn: () => Tensor.from(new RandomGenerator(9).uniform(3 * 2 * 6 * 6, -2, 2), [3, 2, 6, 6]),
};

/** Output, input gradient and every parameter gradient of one training step, read back. */
async function step(model: Sequential, input: Tensor, amp: boolean) {
  const x = Tensor.from(await input.read(), input.shape, { requiresGrad: true });
  const y = tidy(() => autocast(() => model.forward(x), { enabled: amp }));
  const loss = mean(square(y));
  loss.backward();
  const out = [await y.read(), await x.grad!.read()];
  for (const p of model.parameters()) out.push(await p.grad!.read());
  model.zeroGrad();
  for (const t of [x, y, loss]) t.dispose();
  return out.map((values) => Array.from(values));
}

/** A fresh seeded model (the same weights and dropout masks every time), fused or not. */
function build(make: () => Sequential, fuse: boolean): Sequential {
  const model = make();
  model.fuseActivations = fuse;
  return model;
}

Deno.test({
  name:
    "sequential fusion: state dict keys keep PyTorch's indices (0.*, 2.*), ReLU layers hold nothing",
  ...GPU_TEST,
  fn() {
    const model = new Sequential(new Linear(4, 8), new ReLU(), new Linear(8, 2));
    assert.deepEqual([...model.stateDict().keys()], ["0.weight", "0.bias", "2.weight", "2.bias"]);
    model.dispose();
  },
});

Deno.test({
  name: "sequential fusion: the ReLU after Linear and Conv2d runs in their epilogue (no relu " +
    "kernel), the GELU before a Linear as its input GELU",
  ...GPU_TEST,
  fn() {
    for (const [make, x] of [[mlp, inputs.mlp()], [cnn, inputs.cnn()]] as const) {
      const kernels = (fuse: boolean) => {
        const model = build(make, fuse);
        const keys = dispatchedKernels(() => tidy(() => model.forward(x)));
        model.dispose();
        return keys;
      };
      const fused = kernels(true), plain = kernels(false);
      const relus = (keys: string[]) => keys.filter((k) => /op=relu[,}]/.test(k)).length;
      assert.ok(relus(plain) > 0, `the unfused run has relu kernels: ${plain.join(" ")}`);
      assert.equal(relus(fused), 0, fused.join(" "));
      assert.ok(fused.length < plain.length, `${fused.length} vs ${plain.length} kernels`);
      x.dispose();
    }
  },
});

Deno.test({
  name: "sequential fusion: outputs, input and parameter gradients are bit-identical to running " +
    "every layer on its own, f32 and AMP, MLP and CNN",
  ...GPU_TEST,
  async fn() {
    for (const amp of gpu.f16 ? [false, true] : [false]) {
      for (
        const [name, make, input] of [["mlp", mlp, inputs.mlp], ["cnn", cnn, inputs.cnn]] as const
      ) {
        const x = input();
        const fused = build(make, true), plain = build(make, false);
        assert.deepEqual(
          await step(fused, x, amp),
          await step(plain, x, amp),
          `${name} amp=${amp}`,
        );
        for (const t of [x, fused, plain]) t.dispose();
      }
    }
  },
});

Deno.test({
  name: "sequential fusion: checkpointing keeps fused layers in one segment, reports layer " +
    "indices and gives the same bits",
  ...GPU_TEST,
  async fn() {
    for (const spec of ["auto", 3] as const) {
      const x = inputs.mlp();
      const checkpointed = build(mlp, true), plain = build(mlp, false);
      checkpointed.checkpoint = spec;
      assert.deepEqual(await step(checkpointed, x, false), await step(plain, x, false), `${spec}`);
      const segments = checkpointed.lastCheckpointPlan!.segments;
      assert.equal(segments[0][0], 0);
      assert.equal(segments.at(-1)![1], checkpointed.layers.length);
      for (const [i, [a, b]] of segments.entries()) {
        assert.ok(a < b && (i === 0 || segments[i - 1][1] === a), JSON.stringify(segments));
        // A ReLU is never cut off from the Linear before it, nor a GELU from the Linear after.
        assert.ok(!(checkpointed.layers[a] instanceof ReLU), JSON.stringify(segments));
        assert.ok(!(checkpointed.layers[b - 1] instanceof GELU), JSON.stringify(segments));
      }
      for (const t of [x, checkpointed, plain]) t.dispose();
    }
  },
});

Deno.test({
  name: "sequential fusion: a subclass that overrides forward runs as written, unfused",
  ...GPU_TEST,
  async fn() {
    const calls: string[] = [];
    class LoggedLinear extends Linear {
      override forward(x: Tensor): Tensor {
        calls.push("linear");
        return super.forward(x);
      }
    }
    class LoggedReLU extends ReLU {
      override forward(x: Tensor): Tensor {
        calls.push("relu");
        return super.forward(x);
      }
    }
    const model = new Sequential(
      new LoggedLinear(3, 4, { seed: 1 }),
      new ReLU(),
      new Linear(4, 4, { seed: 2 }),
      new LoggedReLU(),
    );
    const x = Tensor.from([1, -2, 3, 0.5, 2, -1], [2, 3]);
    const y = model.forward(x);
    assert.deepEqual(calls, ["linear", "relu"]);
    model.fuseActivations = false;
    assert.deepEqual([...(await y.read())], [...(await model.forward(x).read())]);
    model.dispose();
  },
});
