/**
 * halfstep loads from a URL: the repository is served over HTTP on 127.0.0.1
 * and a separate Deno process imports `mod.ts` by that URL and trains one AMP
 * step. Its loss must equal the same step run here from the local files.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { AdamW, AmpTrainer, crossEntropy, Linear, ReLU, Sequential, Tensor } from "../mod.ts";
import { serveDirectory } from "../examples/web/serve.ts";
import { ROOT } from "./_bundle.ts";
import { GPU_TEST } from "./_gpu.ts";

/** One AMP step of a fixed model; the same source runs in both processes. */
const STEP = `
const model = new Sequential(new Linear(4, 8, { seed: 1 }), new ReLU(), new Linear(8, 2, { seed: 2 }));
const trainer = new AmpTrainer(model, new AdamW(model.parameters(), { lr: 1e-2 }));
const x = Tensor.from([1, 2, 3, 4, 5, 6, 7, 8], [2, 4]);
trainer.step(() => crossEntropy(model.forward(x), [0, 1])).dispose();
const loss = trainer.step(() => crossEntropy(model.forward(x), [0, 1]));
const result = { loss: await loss.item(), skipped: await trainer.scaler.skippedSteps() };
`;

async function stepHere(): Promise<{ loss: number; skipped: number }> {
  const run = new Function(
    "Sequential",
    "Linear",
    "ReLU",
    "AmpTrainer",
    "AdamW",
    "Tensor",
    "crossEntropy",
    `return (async () => { ${STEP} return result; })();`,
  );
  return await run(Sequential, Linear, ReLU, AmpTrainer, AdamW, Tensor, crossEntropy);
}

Deno.test({
  name: "mod.ts imported by URL from a local HTTP server trains an AMP step like the local files",
  ...GPU_TEST,
  async fn() {
    const server = serveDirectory(ROOT);
    const dir = await Deno.makeTempDir();
    try {
      const url = `http://127.0.0.1:${server.addr.port}/mod.ts`;
      await Deno.writeTextFile(
        join(dir, "client.ts"),
        `import { AdamW, AmpTrainer, crossEntropy, initGpu, Linear, ReLU, Sequential, Tensor } from "${url}";\n` +
          `await initGpu({ matmulTiling: "default" });\n${STEP}\nconsole.log(JSON.stringify(result));\n`,
      );
      const out = await new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "--no-lock",
          "--reload",
          "--allow-net=127.0.0.1",
          "--allow-import=127.0.0.1",
          join(dir, "client.ts"),
        ],
        env: { XDG_RUNTIME_DIR: Deno.env.get("XDG_RUNTIME_DIR") ?? "/tmp", NO_COLOR: "1" },
        stdout: "piped",
        stderr: "piped",
      }).output();
      const stderr = new TextDecoder().decode(out.stderr);
      assert.equal(out.code, 0, `the URL import failed:\n${stderr.slice(-2000)}`);
      const remote = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!);
      assert.ok(stderr.includes(`Download ${url}`), "mod.ts really came over HTTP");
      assert.deepEqual(remote, await stepHere());
      assert.equal(remote.skipped, 0);
    } finally {
      await server.shutdown();
      await Deno.remove(dir, { recursive: true });
    }
  },
});
