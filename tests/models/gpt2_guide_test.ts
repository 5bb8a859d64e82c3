/**
 * docs/gpt2.md's "From code" runs as written, in a process of its own and from a folder of its
 * own, importing the models layer by the package's name (`@halfstep/halfstep/models`): beside a
 * GPT-2-shaped `gpt2/model.safetensors` (GPT-2's vocabulary, two layers of width 32, saved the way
 * Hugging Face publishes it), it prints a finite loss and GPT-2 text, and the file it saves loads
 * back to the same weights.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Gpt, gpt2Config, loadGpt2, saveGpt2 } from "../../models/mod.ts";
import { ROOT } from "../helpers/bundle.ts";
import { fencedBlocks, readDoc } from "../helpers/readme.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { withTempDir } from "../helpers/examples.ts";

/** The guide's one TypeScript block under "## From code". */
async function fromCode(): Promise<string> {
  const text = await readDoc("gpt2.md");
  const section = text.slice(text.indexOf("## From code"));
  const [block] = fencedBlocks(section.split("\n")).filter((b) => b.lang === "ts");
  assert.ok(block, "docs/gpt2.md has a TypeScript block under ## From code");
  assert.match(block.code, /from "@halfstep\/halfstep\/models"/, "it imports the models layer");
  return block.code;
}

Deno.test({
  name: "docs/gpt2.md's code runs as written beside a GPT-2-shaped file: a loss, GPT-2 text, and " +
    "a saved file that loads back",
  ...GPU_TEST,
  async fn() {
    const code = await fromCode();
    await withTempDir(async (dir) => {
      await Deno.mkdir(join(dir, "gpt2"));
      const sizes = { vocab: 50257, context: 64, layers: 2, dim: 32, heads: 4 };
      const original = new Gpt(gpt2Config(sizes, 3));
      await saveGpt2(join(dir, "gpt2/model.safetensors"), original);
      await Deno.writeTextFile(join(dir, "guide.ts"), code);
      const run = await new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", "--config", join(ROOT, "deno.json"), "guide.ts"],
        cwd: dir,
        stdout: "piped",
        stderr: "piped",
      }).output();
      const [out, err] = [run.stdout, run.stderr].map((b) => new TextDecoder().decode(b));
      assert.equal(run.code, 0, `the guide's code failed:\n${err.slice(-2000)}`);
      const [lossLine, text] = out.trim().split("\n");
      const loss = Number(lossLine.replace(/^loss /, ""));
      // Untrained: at least about ln(50257) ≈ 10.8 per token, and finite.
      assert.ok(Number.isFinite(loss) && loss > 5, `loss ${lossLine}`);
      assert.ok(text.startsWith("Hello") && text.length > "Hello".length, `text ${text}`);
      const { model } = await loadGpt2(join(dir, "finetuned.safetensors"));
      const [a, b] = await Promise.all([original, model].map((m) => m.tokens.weight.read()));
      assert.deepEqual(a, b, "the saved file holds the loaded weights");
      original.dispose();
      model.dispose();
    });
  },
});
