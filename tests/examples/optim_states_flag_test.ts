/**
 * `--optim-states f32|bf16|8bit` of gpt2.ts, tiny_gpt.ts and mnist.ts: parsed
 * (a bad word refused naming the choices; with mnist's SGD refused), saved
 * among the flags a resumed gpt2 or mnist run must repeat, counted by the preflight's estimate (never below the
 * measured peak of an 8-bit step).
 */
import assert from "node:assert/strict";
import { AdamW, AmpTrainer, Tensor } from "../../mod.ts";
import { parseGpt2Args } from "../../examples/gpt2/args.ts";
import { parseTinyGptArgs } from "../../examples/tiny_gpt/args.ts";
import { parseMnistArgs } from "../../examples/mnist/args.ts";
import { runFlags as mnistRunFlags } from "../../examples/mnist/resume.ts";
import { runFlags } from "../../examples/gpt2/run.ts";
import { checkResumeFlags } from "../../examples/cli/resume_flags.ts";
import { UsageError } from "../../examples/cli/flags.ts";
import { gpt2Parameters, gpt2StepPeakBytes } from "../../examples/gpt2/memory.ts";
import { gpt2Config } from "../../models/mod.ts";
import { Gpt } from "../../models/mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";

const GPT2 = ["--random", "124M", "--prompt", "hi"];

Deno.test("--optim-states: f32 by default, bf16 or 8bit, another word refused", () => {
  const parsers = [
    parseTinyGptArgs,
    parseMnistArgs,
    (a: string[]) => parseGpt2Args([...GPT2, ...a]),
  ];
  for (const parse of parsers) {
    assert.equal(parse([])!.optimStates, "f32");
    assert.equal(parse(["--optim-states", "8bit"])!.optimStates, "8bit");
    assert.equal(parse(["--optim-states=bf16"])!.optimStates, "bf16");
    assert.throws(
      () => parse(["--optim-states", "int8"]),
      (e: Error) =>
        e instanceof UsageError &&
        e.message === '--optim-states must be f32, bf16 or 8bit, not "int8".',
    );
  }
});

Deno.test("--optim-states: a saved gpt2 run resumes only with the moments it was saved with", () => {
  const cfg = (states: string) =>
    parseGpt2Args([
      "--random",
      "124M",
      "--data",
      "my.txt",
      "--optim-states",
      states,
    ])!;
  const saved = runFlags(cfg("8bit"));
  assert.equal(saved.shape["optim-states"], "8bit");
  assert.deepStrictEqual(
    checkResumeFlags("run.safetensors", saved, runFlags(cfg("8bit")), false),
    [],
  );
  assert.throws(
    () => checkResumeFlags("run.safetensors", saved, runFlags(cfg("f32")), true),
    /run\.safetensors was saved by a run with other flags: --optim-states f32 \(saved: 8bit\)/,
  );
});

Deno.test("--optim-states: mnist's SGD keeps no moments; a saved mnist run resumes only with its moments", () => {
  assert.throws(
    () => parseMnistArgs(["--optimizer", "sgd", "--optim-states", "8bit"]),
    (e: Error) =>
      e instanceof UsageError &&
      e.message === "--optim-states is for --optimizer adam: SGD keeps no moments.",
  );
  const flags = (states: string) =>
    mnistRunFlags(parseMnistArgs(["--optim-states", states])!, 60000, 128);
  const saved = flags("bf16");
  assert.equal(saved.shape["optim-states"], "bf16");
  assert.deepStrictEqual(checkResumeFlags("run.safetensors", saved, flags("bf16"), false), []);
  assert.throws(
    () => checkResumeFlags("run.safetensors", saved, flags("8bit"), true),
    /run\.safetensors was saved by a run with other flags: --optim-states 8bit \(saved: bf16\)/,
  );
});

Deno.test(
  "--optim-states: the preflight estimate counts 2 bytes a parameter for 8-bit moments, never below the peak",
  GPU_TEST,
  async () => {
    const sizes = { vocab: 50257, context: 64, layers: 2, dim: 32, heads: 4 };
    const run = {
      batch: 1,
      context: 32,
      amp: true,
      checkpoint: true,
      training: true,
      sampleLength: 1,
    };
    const f32 = gpt2StepPeakBytes(sizes, run);
    const eightBit = gpt2StepPeakBytes(sizes, { ...run, optimStates: "8bit" });
    assert.ok(eightBit < f32 - 4 * gpt2Parameters(sizes), `${eightBit} vs ${f32}`);
    await gpu.sync();
    gpu.resetPeakMemory();
    const before = gpu.memoryStats().allocatedBytes;
    const model = new Gpt(gpt2Config(sizes, 1));
    model.blocks.checkpoint = sizes.layers;
    const optimizer = new AdamW(model.parameters(), { lr: 1e-4, stateDtype: "8bit" });
    const trainer = new AmpTrainer(model, optimizer, { maxGradNorm: 1 });
    const ids = Array.from({ length: 32 }, (_, i) => (i * 7919) % sizes.vocab);
    const x = Tensor.from(ids, [1, 32], { dtype: "i32" });
    const loss = trainer.step(() => model.loss(x, ids));
    await loss.item();
    const peak = gpu.memoryStats().peakBytes - before;
    assert.ok(eightBit >= peak && eightBit <= 1.5 * peak, `estimate ${eightBit}, peak ${peak}`);
    for (const t of [loss, x, trainer, optimizer, model]) t.dispose();
  },
);
