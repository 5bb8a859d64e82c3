/**
 * The examples' pre-flight lists of their largest buffers stay true to the
 * models: for small configurations, no buffer a training step, an evaluation
 * pass or sampling requests from the pool is larger than the largest buffer
 * the list names (so a run the check lets through does not fail an epoch
 * later on a buffer it did not count), and the list is not padded either.
 */
import assert from "node:assert/strict";
import {
  Adam,
  AdamW,
  AmpTrainer,
  crossEntropy,
  noGrad,
  type Sequential,
  Tensor,
  tidy,
} from "../../mod.ts";
import { mnistBuffers, mnistInputShape, mnistModel } from "../../examples/mnist/model.ts";
import { Gpt } from "../../models/mod.ts";
import { tinyGptBuffers } from "../../examples/tiny_gpt/buffers.ts";
import type { PlannedBuffer } from "../../examples/cli/preflight.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";

/** The largest request the pool saw while `fn` ran. */
async function largestRequest(fn: () => Promise<void>): Promise<number> {
  const acquire = gpu.pool.acquire;
  let largest = 0;
  gpu.pool.acquire = (bytes: number, label: () => string) => {
    largest = Math.max(largest, bytes);
    return acquire.call(gpu.pool, bytes, label);
  };
  try {
    await fn();
  } finally {
    gpu.pool.acquire = acquire;
  }
  return largest;
}

const largestPlanned = (plan: PlannedBuffer[]) => Math.max(...plan.map((b) => b.bytes));

/** Two training steps and one forward without gradients of `model` on batches of `n`. */
async function trainAndEvaluate(
  model: Sequential | Gpt,
  input: (n: number) => Tensor,
  targets: (n: number) => Int32Array,
  trainer: AmpTrainer,
  n: number,
): Promise<void> {
  for (let step = 0; step < 2; step++) {
    const loss = trainer.step(() => crossEntropy(model.forward(input(n)), targets(n)));
    await loss.item();
    loss.dispose();
  }
  const logits = noGrad(() => tidy(() => model.forward(input(n))));
  await logits.read();
  logits.dispose();
}

for (const kind of ["mlp", "cnn"] as const) {
  for (const amp of [false, true]) {
    Deno.test({
      name: `examples preflight: mnistBuffers(${kind}) bounds a${
        amp ? "n AMP" : ""
      } step's largest buffer`,
      ...GPU_TEST,
      async fn() {
        const n = 24;
        const model = mnistModel(kind, 0);
        const optimizer = new Adam(model.parameters(), { lr: 1e-3 });
        const trainer = new AmpTrainer(model, optimizer, { enabled: amp && gpu.f16 });
        const pixels = new Float32Array(n * 784).map((_, i) => Math.sin(i));
        const input = (b: number) => Tensor.from(pixels, mnistInputShape(kind, b));
        const targets = (b: number) => Int32Array.from({ length: b }, (_, i) => i % 10);
        const seen = await largestRequest(() =>
          trainAndEvaluate(model, input, targets, trainer, n)
        );
        const planned = largestPlanned(mnistBuffers(kind, n, "batch"));
        assert.ok(seen <= planned, `largest request ${seen} bytes, planned ${planned}`);
        assert.ok(planned <= 1.5 * seen, `planned ${planned} is far above the real ${seen}`);
        trainer.dispose();
        optimizer.dispose();
        model.dispose();
      },
    });
  }
}

for (const fusedAttention of [true, false]) {
  Deno.test({
    name:
      `examples preflight: tinyGptBuffers bounds a step's largest buffer (fused ${fusedAttention})`,
    ...GPU_TEST,
    async fn() {
      const config = { vocab: 27, context: 24, layers: 1, dim: 16, heads: 2, fusedAttention };
      const n = 6;
      const model = new Gpt(config);
      const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
      const trainer = new AmpTrainer(model, optimizer, { enabled: false, maxGradNorm: 1 });
      const ids = Int32Array.from({ length: n * config.context }, (_, i) => (i * 7) % 27);
      const input = (b: number) =>
        Tensor.from(ids.subarray(0, b * config.context), [b, config.context], { dtype: "i32" });
      const targets = (b: number) => ids.subarray(0, b * config.context).map((x) => (x + 1) % 27);
      const seen = await largestRequest(() => trainAndEvaluate(model, input, targets, trainer, n));
      const plan = tinyGptBuffers(config, { batch: n, samples: 1, evalWindows: 1 });
      const planned = largestPlanned(plan.gpu);
      assert.ok(seen <= planned, `largest request ${seen} bytes, planned ${planned}`);
      assert.ok(planned <= 1.5 * seen, `planned ${planned} is far above the real ${seen}`);
      trainer.dispose();
      optimizer.dispose();
      model.dispose();
    },
  });
}
