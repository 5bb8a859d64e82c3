/**
 * A GPT-2-shaped checkpoint for the examples' tests: the torch twin's
 * model.safetensors and config.json (vocabulary 50257, 2 layers, width 32,
 * 4 heads, 32 positions), and a text a small model learns within a few
 * steps. Needs a python3 with torch (CI installs it).
 */
import { join } from "node:path";
import { runTorchScript } from "./torch_script.ts";

/** A text of a few repeated sentences: a small model learns it within a few steps. */
export const TEXT: string = Array.from(
  { length: 60 },
  (_, i) => `The ${["cat", "dog", "bird"][i % 3]} sat on the mat number ${i % 7}.`,
).join("\n");

/** The twin's checkpoint (model.safetensors and config.json) in `dir`. */
export async function checkpoint(dir: string): Promise<string> {
  const spec = join(dir, "spec.json");
  await Deno.writeTextFile(
    spec,
    JSON.stringify({
      vocab: 50257,
      context: 32,
      layers: 2,
      dim: 32,
      heads: 4,
      seed: 2,
      ids: [1, 2],
      shape: [1, 2],
      targets: [2, 3],
      lr: 0,
      weight_decay: 0,
      steps: 0,
      prompt: [1],
      new_tokens: 1,
    }),
  );
  await runTorchScript("gpt2_twin.py", ["make", join(dir, "ckpt"), spec]);
  return join(dir, "ckpt", "model.safetensors");
}
