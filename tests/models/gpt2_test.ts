/**
 * GPT-2 against a torch.nn twin of Hugging Face's GPT2LMHeadModel
 * (tests/fixtures/torch/gpt2_twin.py: HF's names, Conv1D weights stored
 * [in, out], the tanh GELU, tied head), which writes a GPT-2-shaped checkpoint
 * (vocabulary 50257, 2 layers, width 32) as the hub publishes it: halfstep
 * loads it and matches the twin's logits within 1e-4 (f32 and F16 files),
 * its loss after 3 AdamW steps within 1e-4 and its 20 greedy tokens exactly;
 * the file halfstep saves back loads strictly into the twin. Wrong files are
 * refused with one line. The KV cache gives the tokens (and logits) of
 * recomputing the whole context. Needs a python3 with torch (CI installs it).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  AdamW,
  HalfstepError,
  RandomGenerator,
  type SafetensorsEntry,
  Tensor,
  tidy,
} from "../../mod.ts";
import { saveSafetensors } from "../../files.ts";
import { Gpt } from "../../models/mod.ts";
import { fromHuggingFace, gpt2Config, gpt2SizesOf, loadGpt2, saveGpt2 } from "../../models/mod.ts";
import { generate, KvCache } from "../../models/mod.ts";
import { assertClose } from "../helpers/assert.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { runTorchScript } from "../helpers/torch_script.ts";
import { withTempDir } from "../helpers/examples.ts";

const VOCAB = 50257;
const SIZES = { vocab: VOCAB, context: 32, layers: 2, dim: 32, heads: 4 };
const draws = new RandomGenerator(21);
const ids = (n: number) => Array.from(draws.uniform(n), (u) => Math.floor(u * VOCAB));
const SPEC = {
  ...SIZES,
  seed: 3,
  ids: ids(12),
  shape: [2, 6],
  targets: ids(12),
  lr: 1e-3,
  weight_decay: 0.01,
  steps: 3,
  prompt: ids(5),
  new_tokens: 20,
  masks: true,
};

/**
 * "Within 1e-4", as the issue asks: the twin's and halfstep's f32 sums run
 * in other orders (logits of size ~1 over 32 features and two blocks: a few
 * 1e-7 apart), so 1e-4 is loose enough for that and far below what a wrong
 * GELU, a missed transpose or an untied head would give.
 */
const WITHIN = { atol: 1e-4, rtol: 0 };

interface Made {
  logits: number[];
  losses: number[];
  greedy: number[];
}

/** The model's eval logits of SPEC.ids, read back. */
async function logitsOf(model: Gpt): Promise<Float32Array> {
  model.eval();
  const out = tidy(() => model.forward(Tensor.from(SPEC.ids, [2, 6], { dtype: "i32" })));
  const values = await out.read() as Float32Array;
  out.dispose();
  model.train();
  return values;
}

/**
 * One buffer's limits to load the twin's file under: none (the table whole),
 * and one that splits its 50257 × 32 f32 table (6.4 MB) into 4 column pieces,
 * as GPT-2 124M's 154 MB table is split under WebGPU's default 128 MiB.
 */
const LIMITS = [Infinity, 2e6];

Deno.test({
  name: "GPT-2 twin: HF's model.safetensors (no prefix, attn.bias masks, config.json) loads, " +
    "whole and in table pieces; logits within 1e-4, the loss after 3 AdamW steps within 1e-4, " +
    "20 greedy tokens identical, and the file saved back loads strictly into GPT2LMHeadModel",
  ...GPU_TEST,
  async fn() {
    for (const maxBufferBytes of LIMITS) await twinRun(maxBufferBytes);
  },
});

/** The twin test's body under one buffer limit. */
async function twinRun(maxBufferBytes: number): Promise<void> {
  await withTempDir(async (dir) => {
    const spec = join(dir, "spec.json");
    await Deno.writeTextFile(spec, JSON.stringify(SPEC));
    const twin = await runTorchScript("gpt2_twin.py", ["make", dir, spec]) as Made;
    const { model, sizes } = await loadGpt2(join(dir, "model.safetensors"), { maxBufferBytes });
    assert.deepEqual(sizes, SIZES);
    assert.equal(model.tableWeights().length, maxBufferBytes === Infinity ? 1 : 4);
    assert.equal(model.head.weight, model.tokens.weight, "the head is tied");
    assertClose(await logitsOf(model), twin.logits, WITHIN, "logits");
    for (const recompute of [false, true]) {
      const [tokens] = await generate(model, [SPEC.prompt], {
        maxNewTokens: SPEC.new_tokens,
        temperature: 0,
        recompute,
      });
      assert.deepEqual(tokens, twin.greedy, `greedy tokens, recompute ${recompute}`);
    }
    const optimizer = new AdamW(model.parameters(), { lr: SPEC.lr, weightDecay: 0.01 });
    const losses: number[] = [];
    for (let step = 0; step <= SPEC.steps; step++) {
      const x = Tensor.from(SPEC.ids, [2, 6], { dtype: "i32" });
      const loss = tidy(() => model.loss(x, SPEC.targets, { chunkRows: 5 }));
      losses.push(await loss.item());
      loss.backward();
      if (step < SPEC.steps) optimizer.step();
      model.zeroGrad();
      loss.dispose();
      x.dispose();
    }
    assertClose(losses, twin.losses, WITHIN, `the loss before each AdamW step and after the 3rd`);
    const saved = join(dir, "saved.safetensors");
    await saveGpt2(saved, model);
    const back = await runTorchScript("gpt2_twin.py", ["load", saved, spec]) as {
      keys: string[];
      logits: number[];
    };
    assert.ok(
      back.keys.includes("lm_head.weight") && back.keys.includes("transformer.wte.weight"),
    );
    assertClose(
      await logitsOf(model),
      back.logits,
      WITHIN,
      "the twin's logits of the saved file",
    );
    optimizer.dispose();
    model.dispose();
  });
}

Deno.test({
  name: "GPT-2 twin: an F16 model.safetensors loads into f32 parameters, logits within 1e-4",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const spec = join(dir, "spec.json");
      await Deno.writeTextFile(
        spec,
        JSON.stringify({ ...SPEC, f16: true, masks: false, steps: 0 }),
      );
      const twin = await runTorchScript("gpt2_twin.py", ["make", dir, spec]) as Made;
      const { model } = await loadGpt2(join(dir, "model.safetensors"));
      assert.equal(model.tokens.weight.dtype, "f32");
      assertClose(await logitsOf(model), twin.logits, WITHIN, "logits of the F16 file");
      model.dispose();
    });
  },
});

/** A GPT-2 state of `SIZES` as host tensors under HF's published names (zeros). */
function hfState(dim = SIZES.dim): Map<string, SafetensorsEntry> {
  const entry = (shape: number[]): SafetensorsEntry => ({
    dtype: "f32",
    shape,
    data: new Uint8Array(4 * shape.reduce((a, b) => a * b, 1)),
  });
  const c = dim;
  const state = new Map<string, SafetensorsEntry>([
    ["wte.weight", entry([61, c])],
    ["wpe.weight", entry([16, c])],
    ["ln_f.weight", entry([c])],
    ["ln_f.bias", entry([c])],
  ]);
  for (let i = 0; i < 2; i++) {
    for (
      const [name, shape] of [
        ["ln_1.weight", [c]],
        ["ln_1.bias", [c]],
        ["attn.c_attn.weight", [c, 3 * c]],
        ["attn.c_attn.bias", [3 * c]],
        ["attn.c_proj.weight", [c, c]],
        ["attn.c_proj.bias", [c]],
        ["ln_2.weight", [c]],
        ["ln_2.bias", [c]],
        ["mlp.c_fc.weight", [c, 4 * c]],
        ["mlp.c_fc.bias", [4 * c]],
        ["mlp.c_proj.weight", [4 * c, c]],
        ["mlp.c_proj.bias", [c]],
      ] as const
    ) state.set(`h.${i}.${name}`, entry([...shape]));
  }
  return state;
}

Deno.test({
  name: "GPT-2 files: a missing tensor, a wrong shape, a non-GPT-2 file, an untied head and an " +
    "unknown width are refused with one HalfstepError line naming them; nothing is loaded",
  ...GPU_TEST,
  async fn() {
    const good = hfState();
    assert.deepEqual(gpt2SizesOf(good, { heads: 4 }), {
      vocab: 61,
      context: 16,
      layers: 2,
      dim: 32,
      heads: 4,
    });
    const prefixed = new Map([...good].map(([n, v]) => [`transformer.${n}`, v]));
    assert.equal(gpt2SizesOf(prefixed, { heads: 4 }).layers, 2, "the transformer. prefix");
    const cases: [string, Map<string, SafetensorsEntry>, RegExp][] = [];
    const missing = new Map(good);
    missing.delete("h.1.mlp.c_fc.bias");
    cases.push(["missing", missing, /lacks "h\.1\.mlp\.c_fc\.bias"/]);
    const linearLayout = new Map(good);
    linearLayout.set("h.0.attn.c_attn.weight", {
      ...good.get("h.0.attn.c_attn.weight")!,
      shape: [96, 32],
    });
    cases.push([
      "[out, in] layout",
      linearLayout,
      /h\.0\.attn\.c_attn\.weight is f32 \[96, 32\], expected .*\[32, 96\]/,
    ]);
    const mlp = new Map([["0.weight", good.get("wte.weight")!]]);
    cases.push(["an MLP's file", mlp, /not a GPT-2 checkpoint/]);
    const extra = new Map(good);
    extra.set("h.0.attn.q_proj.weight", good.get("ln_f.weight")!);
    cases.push(["a foreign name", extra, /"h\.0\.attn\.q_proj\.weight" is not a name of GPT-2/]);
    const untied = new Map(good);
    untied.set("lm_head.weight", {
      ...good.get("wte.weight")!,
      data: new Uint8Array(61 * 32 * 4).fill(1),
    });
    cases.push(["an untied head", untied, /lm_head\.weight differs/]);
    for (const [what, state, message] of cases) {
      assert.throws(
        () => gpt2SizesOf(state, { heads: 4 }),
        (e: unknown) =>
          e instanceof HalfstepError && message.test(e.message) && !e.message.includes("\n"),
        what,
      );
    }
    assert.throws(() => gpt2SizesOf(good), /give the head count/, "width 32 needs a head count");
    assert.throws(
      () => gpt2SizesOf(good, { json: { n_layer: 3 } }),
      /config\.json says n_layer 3, the tensors 2/,
    );
    // A state whose names and shapes fit but whose values do not (NaN) changes nothing.
    const model = new Gpt(gpt2Config({ ...SIZES, vocab: 61, context: 16 }));
    const before = await model.tokens.weight.read();
    const nan = new Map(good);
    nan.set("ln_f.bias", {
      dtype: "f32",
      shape: [32],
      data: new Uint8Array(new Float32Array(32).fill(NaN).buffer),
    });
    assert.throws(() => model.loadStateDict(fromHuggingFace(nan)), /nothing was changed/);
    assert.deepEqual(await model.tokens.weight.read(), before, "nothing loaded");
    model.dispose();
  },
});

Deno.test({
  name: "GPT-2 KV cache: the same tokens and logits as recomputing the whole context, greedy " +
    "and sampled (temperature, top-k), two prompts at once",
  ...GPU_TEST,
  async fn() {
    const model = new Gpt(
      gpt2Config({ vocab: 61, context: 40, layers: 2, dim: 24, heads: 3 }, 4),
    );
    const prompts = [[1, 5, 9, 2], [7, 7, 3, 60]];
    for (const sampling of [{ temperature: 0 }, { temperature: 0.8, topK: 5, seed: 2 }]) {
      const options = { maxNewTokens: 30, ...sampling };
      const cached = await generate(model, prompts, options);
      const whole = await generate(model, prompts, { ...options, recompute: true });
      assert.deepEqual(cached, whole, JSON.stringify(sampling));
    }
    // Logits position by position: the prompt at once, then one token at a time.
    const sequence = [
      ...prompts[0],
      ...(await generate(model, [prompts[0]], { maxNewTokens: 12, temperature: 0 }))[0],
    ];
    const cache = new KvCache(model, 1, sequence.length);
    model.eval();
    const stepped: Float32Array[] = [await cache.step(sequence.slice(0, 4)).read() as Float32Array];
    for (let t = 4; t < sequence.length - 1; t++) {
      stepped.push(await cache.step([sequence[t]]).read() as Float32Array);
    }
    const all = await tidy(() =>
      model.forward(Tensor.from(sequence.slice(0, -1), [1, sequence.length - 1], { dtype: "i32" }))
    ).read();
    stepped.forEach((row, i) =>
      assertClose(
        row,
        all.subarray((i + 3) * 61, (i + 4) * 61),
        { atol: 1e-5, rtol: 1e-5 },
        `position ${i + 3}`,
      )
    );
    cache.dispose();
    model.dispose();
  },
});

Deno.test({
  name:
    "GPT-2 files: saveGpt2 writes GPT2LMHeadModel's names (transformer.*, lm_head) with Conv1D " +
    "weights [in, out], and they load back into the same model",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const model = new Gpt(
        gpt2Config({ vocab: 61, context: 16, layers: 2, dim: 8, heads: 2 }, 9),
      );
      const path = join(dir, "m.safetensors");
      await saveGpt2(path, model);
      const { loadSafetensors } = await import("../../files.ts");
      const { entries } = await loadSafetensors(path);
      assert.deepEqual(entries.get("transformer.h.1.mlp.c_fc.weight")!.shape, [8, 32]);
      assert.ok(entries.has("lm_head.weight"));
      const { model: back } = await loadGpt2(path, { heads: 2 });
      for (const [name, t] of model.stateDict()) {
        assert.deepEqual(await back.stateDict().get(name)!.read(), await t.read(), name);
      }
      // A plain safetensors of our own names is not a GPT-2 file.
      await saveSafetensors(join(dir, "own.safetensors"), model.stateDict());
      await assert.rejects(() => loadGpt2(join(dir, "own.safetensors")), /not a GPT-2 checkpoint/);
      back.dispose();
      model.dispose();
    });
  },
});

Deno.test({
  name: "GPT-2 KV cache filled to the model's context: a prompt and new tokens making exactly " +
    "`context` positions give the tokens and the last logits of recomputing the whole context",
  ...GPU_TEST,
  async fn() {
    const context = 24;
    const model = new Gpt(gpt2Config({ vocab: 61, context, layers: 2, dim: 24, heads: 3 }, 5));
    const prompt = [3, 14, 15, 9];
    const options = { maxNewTokens: context - prompt.length, temperature: 0 };
    const [cached] = await generate(model, [prompt], options);
    const [whole] = await generate(model, [prompt], { ...options, recompute: true });
    assert.equal(cached.length, context - prompt.length);
    assert.deepEqual(cached, whole, "greedy tokens to the last position");
    // The cache at its full length: position context − 1's logits against the whole forward.
    const sequence = [...prompt, ...cached].slice(0, context);
    const cache = new KvCache(model, 1, context);
    model.eval();
    let last = await cache.step(sequence.slice(0, 4)).read() as Float32Array;
    for (let t = 4; t < context; t++) last = await cache.step([sequence[t]]).read() as Float32Array;
    assert.equal(cache.position, context);
    assert.throws(() => cache.step([1]), RangeError, "no position left");
    const all = await tidy(() =>
      model.forward(Tensor.from(sequence, [1, context], { dtype: "i32" }))
    ).read();
    assertClose(last, all.subarray((context - 1) * 61), { atol: 1e-5, rtol: 1e-5 }, "last");
    cache.dispose();
    model.dispose();
  },
});
