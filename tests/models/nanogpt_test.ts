/**
 * The tiny GPT with nanoGPT's options: tied token table and head (one
 * parameter: both uses' gradients summed, listed once for optimizers, saved
 * under both names, never loaded from two different values), no head bias,
 * no biases; and the nanoGPT name mapping both ways. Against PyTorch's own
 * nanoGPT: tests/torch/torch_twins_test.ts.
 */
import assert from "node:assert/strict";
import {
  AdamW,
  AmpTrainer,
  autocast,
  crossEntropy,
  RandomGenerator,
  Tensor,
  tidy,
  ValueError,
} from "../../mod.ts";
import { loadModule, loadTrainingState, saveModule, saveTrainingState } from "../../files.ts";
import { Gpt, type GptConfig } from "../../models/mod.ts";
import { fromNanoGpt, nanoGptConfig, toNanoGpt } from "../../models/mod.ts";
import { assertClose } from "../helpers/assert.ts";
import { GPU_TEST } from "../helpers/gpu.ts";

const SIZES = { vocab: 13, context: 8, layers: 2, dim: 16, heads: 2, seed: 4 };
const NANOGPT: GptConfig = { ...SIZES, tieEmbeddings: true, headBias: false, bias: false };

/** nanoGPT's `GPT.state_dict()` keys for 2 layers, bias=False, in its order (model.py). */
const NANOGPT_KEYS = [
  "transformer.wte.weight",
  "transformer.wpe.weight",
  ...[0, 1].flatMap((i) =>
    [
      "ln_1.weight",
      "attn.c_attn.weight",
      "attn.c_proj.weight",
      "ln_2.weight",
      "mlp.c_fc.weight",
      "mlp.c_proj.weight",
    ].map((n) => `transformer.h.${i}.${n}`)
  ),
  "transformer.ln_f.weight",
  "lm_head.weight",
];

function ids(seed: number, b = 3, t = SIZES.context): { x: Tensor; targets: number[] } {
  const draws = new RandomGenerator(seed).uniform(2 * b * t);
  const all = Array.from(draws, (u) => Math.floor(u * SIZES.vocab));
  return {
    x: Tensor.from(all.slice(0, b * t), [b, t], { dtype: "i32" }),
    targets: all.slice(b * t),
  };
}

/** One loss + backward; returns each named parameter's gradient. */
async function gradients(model: Gpt, amp: boolean): Promise<Map<string, Float32Array>> {
  const { x, targets } = ids(1);
  const loss = tidy(() =>
    autocast(() => crossEntropy(model.forward(x), targets), { enabled: amp })
  );
  loss.backward();
  const out = new Map<string, Float32Array>();
  for (const [name, p] of model.namedParameters()) {
    out.set(name, (await p.grad!.read()) as Float32Array);
  }
  model.zeroGrad();
  loss.dispose();
  x.dispose();
  return out;
}

Deno.test({
  name: "Gpt tieEmbeddings: one parameter whose gradient is the sum of both uses, f32 and AMP",
  ...GPU_TEST,
  async fn() {
    const tied = new Gpt(NANOGPT);
    const untied = new Gpt({ ...NANOGPT, tieEmbeddings: false });
    // The tied state lists the table under both names, so the untied model takes it as is.
    untied.loadStateDict(tied.stateDict());
    assert.equal(tied.head.weight, tied.tokens.weight);
    assert.equal(tied.stateDict().get("head.weight"), tied.stateDict().get("tokens.weight"));
    assert.equal(tied.parameters().length, untied.parameters().length - 1);
    assert.ok(!tied.namedParameters().some(([name]) => name === "head.weight"));
    assert.ok(![...tied.stateDict().keys()].some((n) => n.endsWith(".bias")), "no biases");
    for (const amp of [false, true]) {
      const g = await gradients(tied, amp), u = await gradients(untied, amp);
      const table = u.get("tokens.weight")!, head = u.get("head.weight")!;
      const sum = table.map((v, i) => v + head[i]);
      // Both sums add the same two f32 terms, in either order: a few ulp.
      assertClose(g.get("tokens.weight")!, sum, { atol: 1e-7, rtol: 1e-5 }, `amp ${amp}`);
      for (const [name, grad] of g) {
        if (name !== "tokens.weight") assert.deepEqual(grad, u.get(name), `${name}, amp ${amp}`);
      }
    }
    // An optimizer sees the table once: one step moves it once (as in the untied model's view).
    const optimizer = new AdamW(tied.parameters(), { lr: 0.1 });
    const before = await tied.tokens.weight.read();
    const { x, targets } = ids(2);
    const loss = tidy(() => crossEntropy(tied.forward(x), targets));
    loss.backward();
    optimizer.step();
    const after = await tied.head.weight.read();
    // AdamW's first step moves each entry by lr·sign(g) (plus decay): twice would be ≈ 0.2.
    const moved = after.map((v, i) => Math.abs(v - before[i]));
    assert.ok(Math.max(...moved) < 0.11, `largest move ${Math.max(...moved)}`);
    for (const t of [loss, x]) t.dispose();
    optimizer.dispose();
    tied.dispose();
    untied.dispose();
  },
});

Deno.test({
  name: "Gpt tieEmbeddings: a file holds both names and loads back tied; " +
    "two different tables are refused with nothing changed",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      const model = new Gpt(NANOGPT);
      const path = `${dir}/tied.safetensors`;
      await saveModule(path, model);
      const fresh = new Gpt({ ...NANOGPT, seed: 9 });
      await loadModule(path, fresh);
      assert.equal(fresh.head.weight, fresh.tokens.weight);
      assert.deepEqual(await fresh.head.weight.read(), await model.tokens.weight.read());

      const other = new Gpt({ ...NANOGPT, tieEmbeddings: false, seed: 5 });
      const mixed = new Map(model.stateDict());
      mixed.set("head.weight", other.head.weight);
      const kept = await fresh.tokens.weight.read();
      assert.throws(
        () => fresh.loadStateDict(mixed),
        (e: unknown) =>
          e instanceof ValueError &&
          /tokens\.weight and head\.weight are one tied tensor but get different values/.test(
            e.message,
          ) && /nothing was changed/.test(e.message),
      );
      assert.deepEqual(await fresh.tokens.weight.read(), kept);
      for (const m of [model, fresh, other]) m.dispose();
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "nanoGPT names: toNanoGpt gives nanoGPT's state_dict keys, fromNanoGpt maps them back",
  ...GPU_TEST,
  async fn() {
    const model = new Gpt(NANOGPT);
    const theirs = toNanoGpt(model);
    assert.deepEqual([...theirs.keys()].sort(), [...NANOGPT_KEYS].sort());
    assert.equal(theirs.get("lm_head.weight"), theirs.get("transformer.wte.weight"));
    const back = fromNanoGpt(theirs);
    assert.deepEqual([...back.keys()].sort(), [...model.stateDict().keys()].sort());
    for (const [name, t] of back) assert.equal(t, model.stateDict().get(name), name);
    // What nanoGPT's files hold besides: torch.compile's prefix, PyTorch 1's mask
    // buffers, one name of the tied pair.
    const host = new Map<string, { dtype: "f32"; shape: number[]; data: Uint8Array }>();
    for (const [name, t] of theirs) {
      const data = new Uint8Array(((await t.read()) as Float32Array).buffer);
      host.set(`_orig_mod.${name}`, { dtype: "f32", shape: [...t.shape], data });
    }
    host.delete("_orig_mod.lm_head.weight");
    const mask = { dtype: "f32" as const, shape: [1, 1, 8, 8], data: new Uint8Array(256) };
    host.set("_orig_mod.transformer.h.1.attn.bias", mask);
    const fresh = new Gpt({ ...NANOGPT, seed: 7 });
    fresh.loadStateDict(fromNanoGpt(host));
    assert.deepEqual(await fresh.head.weight.read(), await model.tokens.weight.read());
    const { seed: _, ...sizes } = NANOGPT;
    assert.deepEqual(nanoGptConfig(host, { heads: 2 }), { ...sizes, gelu: "none" });
    const untied = new Gpt({ ...SIZES, headBias: true });
    const config = nanoGptConfig(toNanoGpt(untied), { heads: 2 });
    assert.equal(config.tieEmbeddings, false);
    assert.equal(config.headBias, true);
    assert.equal(config.bias, true);
    host.set("transformer.h.0.attn.c_attn.scale", mask);
    host.set("lm_head.extra", mask);
    assert.throws(
      () => fromNanoGpt(host),
      /fromNanoGpt: "transformer.h.0.attn.c_attn.scale", "lm_head.extra" are not names of nanoGPT's GPT/,
    );
    for (const m of [model, fresh, untied]) m.dispose();
  },
});

Deno.test({
  name: "Gpt tieEmbeddings under AmpTrainer: one master and working copy for the table, " +
    "and a saved run resumes exactly, still tied",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const make = () => {
      const model = new Gpt(NANOGPT);
      const optimizer = new AdamW(model.parameters(), { lr: 0.01 });
      const trainer = new AmpTrainer(model, optimizer, { maxGradNorm: 1 });
      return { model, optimizer, trainer };
    };
    const step = (run: ReturnType<typeof make>, seed: number) => {
      const { x, targets } = ids(seed);
      run.trainer.step(() => crossEntropy(run.model.forward(x), targets)).dispose();
      x.dispose();
    };
    try {
      const a = make();
      if (a.trainer.masters) {
        const masters = a.trainer.masters.masters;
        assert.equal(masters.filter((t) => t === a.model.tokens.weight).length, 1);
        assert.equal(masters.length, a.model.parameters().length);
      }
      step(a, 1);
      step(a, 2);
      const path = `${dir}/run.safetensors`;
      await saveTrainingState(path, a);
      const b = make();
      await loadTrainingState(path, b);
      assert.equal(b.model.head.weight, b.model.tokens.weight);
      step(a, 3);
      step(b, 3);
      for (const [name, t] of a.model.stateDict()) {
        assert.deepEqual(await b.model.stateDict().get(name)!.read(), await t.read(), name);
      }
      for (const run of [a, b]) {
        run.trainer.dispose();
        run.optimizer.dispose();
        run.model.dispose();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
