/**
 * The GPT-2 preflight (examples/gpt2/memory.ts, what `gpt2.ts` checks before its first step)
 * against the buffer pool's measured peak of real steps of a small GPT-2-shaped model: never
 * below, at most 1.5 times, in every precision, checkpointing, optimizer-state and gradient mode
 * the examples offer.
 */
import assert from "node:assert/strict";
import { AdamW, AmpTrainer, Tensor } from "../../mod.ts";
import { Gpt, gpt2Config } from "../../models/mod.ts";
import { gpt2StepPeakBytes } from "../../examples/gpt2/memory.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";

const VOCAB = 50257;

Deno.test({
  name: "GPT-2 preflight: the estimate of a step's peak is never below the measured peak and at " +
    "most 1.5 times it, in f32, AMP, AMP + checkpointing and bf16 + checkpointing, and with " +
    "8-bit AdamW and f16 (or bf16) gradients",
  ...GPU_TEST,
  async fn() {
    const sizes = { vocab: VOCAB, context: 64, layers: 2, dim: 32, heads: 4 };
    for (const [batch, context] of [[1, 32], [3, 64]]) {
      for (
        const [amp, checkpoint, dtype, states, gradDtype] of [
          [false, false, "f16", "f32", "f32"],
          [true, false, "f16", "f32", "f32"],
          [true, true, "f16", "f32", "f32"],
          [true, true, "bf16", "f32", "f32"],
          [true, true, "f16", "8bit", "f16"],
          [true, true, "bf16", "8bit", "bf16"],
        ] as const
      ) {
        await gpu.sync();
        gpu.resetPeakMemory();
        const before = gpu.memoryStats().allocatedBytes;
        const model = new Gpt(gpt2Config(sizes, 1));
        if (checkpoint) model.blocks.checkpoint = sizes.layers;
        const optimizer = new AdamW(model.parameters(), { lr: 1e-4, stateDtype: states });
        const trainer = new AmpTrainer(model, optimizer, {
          enabled: amp,
          dtype,
          maxGradNorm: 1,
          gradDtype,
        });
        const ids = Array.from({ length: batch * context }, (_, i) => (i * 7919) % VOCAB);
        const x = Tensor.from(ids, [batch, context], { dtype: "i32" });
        const loss = trainer.step(() => model.loss(x, ids));
        await loss.item();
        const peak = gpu.memoryStats().peakBytes - before;
        const run = {
          batch,
          context,
          amp,
          checkpoint,
          training: true,
          sampleLength: 1,
          optimStates: states,
          gradDtype: trainer.gradDtype,
        };
        const estimate = gpt2StepPeakBytes(sizes, run);
        const what = `${batch}×${context} amp ${amp} ${dtype} checkpoint ${checkpoint} ` +
          `${states} states, ${trainer.gradDtype} gradients`;
        assert.ok(estimate >= peak && estimate <= 1.5 * peak, `${what}: ${estimate} vs ${peak}`);
        for (const t of [loss, x, trainer, optimizer, model]) t.dispose();
      }
    }
  },
});
