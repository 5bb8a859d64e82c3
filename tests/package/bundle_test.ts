/**
 * `deno task bundle` makes one minified ESM file with a source map in dist/, and that
 * file alone (no TypeScript, no Deno APIs) trains an AMP step like the sources.
 */
import assert from "node:assert/strict";
import { buildBundle } from "../helpers/bundle.ts";
import { GPU_TEST } from "../helpers/gpu.ts";

Deno.test({
  name: "the esbuild bundle of mod.ts trains an AMP step",
  ...GPU_TEST,
  async fn() {
    const outfile = await buildBundle();
    const size = (await Deno.stat(outfile)).size;
    assert.ok(size > 20_000 && size < 1_000_000, `bundle size ${size}`);
    assert.ok((await Deno.stat(`${outfile}.map`)).size > 0, "source map written");
    const lib = await import(new URL(`file://${outfile}`).href);
    const gpu = await lib.initGpu({ matmulTiling: "default" }); // the bundle's own device state
    const model = new lib.Sequential(
      new lib.Linear(4, 8, { seed: 1 }),
      new lib.ReLU(),
      new lib.Linear(8, 2, { seed: 2 }),
    );
    const trainer = new lib.AmpTrainer(model, new lib.AdamW(model.parameters(), { lr: 1e-2 }));
    const x = lib.Tensor.from([1, 2, 3, 4, 5, 6, 7, 8], [2, 4]);
    const losses: number[] = [];
    for (let i = 0; i < 60; i++) {
      const loss = trainer.step(() => lib.crossEntropy(model.forward(x), [0, 1]));
      losses.push(await loss.item());
      loss.dispose();
    }
    assert.ok(
      losses[59] < losses[0] * 0.5,
      `the bundled library trains: ${losses[0]} → ${losses[59]}`,
    );
    gpu.destroy();
  },
});
