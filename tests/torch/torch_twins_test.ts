/**
 * The examples' models against PyTorch itself (tests/fixtures/torch/example_twins.py): the MNIST
 * MLP's and CNN's files and the tiny GPT's, under nanoGPT's names, load with
 * `load_state_dict(strict=True)` into torch.nn twins (nanoGPT's own module layout for the GPT)
 * with eval outputs within 1e-5; and a nanoGPT checkpoint PyTorch makes loads into the tiny GPT,
 * tied weights kept tied, with the same logits. Needs a python3 with torch: without one these
 * tests fail (CI installs python3-torch).
 */
import assert from "node:assert/strict";
import { AdamW, crossEntropy, RandomGenerator, SGD, sum, Tensor, tidy } from "../../mod.ts";
import { loadSafetensors, saveModule, saveSafetensors } from "../../files.ts";
import { mnistInputShape, mnistModel } from "../../examples/mnist/model.ts";
import { Gpt, type GptConfig } from "../../models/mod.ts";
import { fromNanoGpt, nanoGptConfig, toNanoGpt } from "../../models/mod.ts";
import { assertClose, type Tolerance } from "../helpers/assert.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { uniform } from "../helpers/reference.ts";
import { runTorchScript } from "../helpers/torch_script.ts";
import { events, run, TINY_GPT, withTempDir } from "../helpers/examples.ts";
import { join } from "node:path";

const EVAL_TOL: Tolerance = { atol: 1e-5, rtol: 1e-5 };
const TWINS = "example_twins.py";

interface TorchOutput {
  y: number[];
  keys: string[];
}

Deno.test({
  name: "torch twins: the examples' MLP and CNN files load strictly into torch.nn, " +
    "eval outputs within 1e-5",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      for (const kind of ["mlp", "cnn"] as const) {
        const model = mnistModel(kind, 3), shape = mnistInputShape(kind, 4);
        const size = shape.reduce((a, b) => a * b, 1);
        // A few training steps: weights and BatchNorm statistics are halfstep's own.
        const optimizer = new SGD(model.parameters(), { lr: 0.05 });
        for (let i = 0; i < 3; i++) {
          const x = Tensor.from(uniform(size, i), shape);
          const loss = tidy(() => crossEntropy(model.forward(x), [1, 7, 3, 0]));
          loss.backward();
          optimizer.step();
          model.zeroGrad();
          loss.dispose();
          x.dispose();
        }
        const path = `${dir}/${kind}.safetensors`, spec = `${dir}/${kind}.json`;
        await saveModule(path, model);
        const x = Array.from(uniform(size, 9));
        await Deno.writeTextFile(spec, JSON.stringify({ x, shape }));
        model.eval();
        const ours = await tidy(() => model.forward(Tensor.from(x, shape))).read();
        const theirs = await runTorchScript(TWINS, ["load", kind, path, spec]) as TorchOutput;
        assert.deepEqual(theirs.keys.sort(), [...model.stateDict().keys()].sort(), kind);
        assertClose(ours, theirs.y, EVAL_TOL, `${kind}: PyTorch's eval output of halfstep's file`);
        optimizer.dispose();
        model.dispose();
      }
    });
  },
});

const GPT: GptConfig = { vocab: 13, context: 8, layers: 2, dim: 16, heads: 2, seed: 5 };
const IDS = Array.from(new RandomGenerator(11).uniform(2 * 8), (u) => Math.floor(u * 13));

/** The model's eval logits for IDS ([2, 8]). */
async function logits(model: Gpt): Promise<number[]> {
  model.eval();
  const out = tidy(() => model.forward(Tensor.from(IDS, [2, 8], { dtype: "i32" })));
  const values = Array.from(await out.read());
  out.dispose();
  return values;
}

Deno.test({
  name: "torch twins: the tiny GPT under nanoGPT's names loads strictly into nanoGPT's GPT " +
    "(tied, no head bias, exact GELU, with and without biases), logits within 1e-5",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      for (const bias of [true, false]) {
        const config = { ...GPT, tieEmbeddings: true, headBias: false, bias };
        const model = new Gpt(config);
        const optimizer = new AdamW(model.parameters(), { lr: 0.01 });
        for (let i = 0; i < 2; i++) {
          const x = Tensor.from(IDS, [2, 8], { dtype: "i32" });
          const loss = tidy(() => sum(model.forward(x)));
          loss.backward();
          optimizer.step();
          model.zeroGrad();
          loss.dispose();
          x.dispose();
        }
        const path = `${dir}/gpt.safetensors`, spec = `${dir}/gpt.json`;
        await saveSafetensors(path, toNanoGpt(model));
        await Deno.writeTextFile(spec, JSON.stringify({ ids: IDS, shape: [2, 8], config }));
        const ours = await logits(model);
        const theirs = await runTorchScript(TWINS, ["load", "gpt", path, spec]) as TorchOutput;
        assert.ok(theirs.keys.includes("lm_head.weight") && !theirs.keys.includes("lm_head.bias"));
        assertClose(ours, theirs.y, EVAL_TOL, `bias ${bias}: nanoGPT's logits of halfstep's file`);
        optimizer.dispose();
        model.dispose();
      }
    });
  },
});

Deno.test({
  name: "torch twins: a nanoGPT checkpoint PyTorch made loads into the tiny GPT, tied weights " +
    "kept tied, logits within 1e-5 (and the tanh GELU would miss them)",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      // PyTorch 1's nanoGPT saves its causal masks as attn.bias buffers; fromNanoGpt drops them.
      for (const bias of [true, false]) {
        const config = { ...GPT, bias, mask_buffer: bias };
        const path = `${dir}/nanogpt.safetensors`, spec = `${dir}/nanogpt.json`;
        await Deno.writeTextFile(
          spec,
          JSON.stringify({ seed: 7, ids: IDS, shape: [2, 8], config }),
        );
        const theirs = await runTorchScript(TWINS, ["make-gpt", path, spec]) as TorchOutput;
        const { entries } = await loadSafetensors(path);
        assert.equal(entries.has("transformer.h.0.attn.bias"), bias);
        const found = nanoGptConfig(entries, { heads: GPT.heads });
        assert.deepEqual(
          [found.tieEmbeddings, found.headBias, found.bias, found.layers],
          [true, false, bias, 2],
        );
        const loaded = (gelu: "none" | "tanh") => {
          const model = new Gpt({ ...found, gelu, seed: 1 });
          model.loadStateDict(fromNanoGpt(entries));
          return model;
        };
        const model = loaded("none");
        assert.equal(model.head.weight, model.tokens.weight, "tied kept tied");
        assertClose(await logits(model), theirs.y, EVAL_TOL, `bias ${bias}: halfstep's logits`);
        const tanh = loaded("tanh");
        // The check can tell the GELUs apart: the tanh form's logits miss PyTorch's by more.
        const approximate = await logits(tanh);
        assert.throws(
          () => assertClose(approximate, theirs.y, EVAL_TOL, "tanh"),
          (e: unknown) => e instanceof Error && e.message.startsWith("tanh: element"),
        );
        model.dispose();
        tanh.dispose();
      }
    });
  },
});

Deno.test({
  name: "torch twins: tiny_gpt --tie-embeddings --no-head-bias --no-bias --save-nanogpt writes " +
    "a file nanoGPT's GPT loads strictly, logits within 1e-5 of halfstep's",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const path = join(dir, "gpt.safetensors"), spec = join(dir, "gpt.json");
      const sizes = ["--layers", "1", "--dim", "16", "--heads", "2", "--context", "8"];
      const quick = ["--steps", "3", "--log-every", "3", "--eval-windows", "8", "--samples", "1"];
      const nanogpt = ["--tie-embeddings", "--no-head-bias", "--no-bias", "--save-nanogpt", path];
      const r = await run(TINY_GPT, [...sizes, ...quick, ...nanogpt, "--json"]);
      assert.equal(r.code, 0, r.stderr);
      assert.ok(events(r.stdout).some((e) => e.event === "saved" && e.path === path));
      const { entries } = await loadSafetensors(path);
      const config = nanoGptConfig(entries, { heads: 2 });
      assert.deepEqual(
        [config.tieEmbeddings, config.headBias, config.bias, config.context],
        [true, false, false, 8],
      );
      const model = new Gpt(config);
      model.loadStateDict(fromNanoGpt(entries));
      const ids = IDS.map((i) => i % config.vocab);
      await Deno.writeTextFile(spec, JSON.stringify({ ids, shape: [2, 8], config }));
      const theirs = await runTorchScript(TWINS, ["load", "gpt", path, spec]) as TorchOutput;
      model.eval();
      const out = tidy(() => model.forward(Tensor.from(ids, [2, 8], { dtype: "i32" })));
      assertClose(await out.read(), theirs.y, EVAL_TOL, "the example's file in nanoGPT");
      out.dispose();
      model.dispose();
    });
  },
});
