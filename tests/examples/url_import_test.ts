/**
 * halfstep loads from a URL: the repository is served over HTTP on 127.0.0.1
 * and a separate Deno process imports `mod.ts` by that URL and trains one AMP
 * step. Its loss must equal the same step run here from the local files. And
 * the browser guide's URL import (server command, module, client command) runs
 * as written, read from docs/browser.md so that the test breaks when the guide drifts.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { AdamW, AmpTrainer, crossEntropy, Linear, ReLU, Sequential, Tensor } from "../../mod.ts";
import { serveDirectory } from "../../examples/web/serve.ts";
import { ROOT } from "../helpers/bundle.ts";
import { readDoc, shellLines } from "../helpers/readme.ts";
import { GPU_TEST } from "../helpers/gpu.ts";

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

/** The browser guide's URL import, as written in its "Import by URL" section. */
async function readmeUrlImport() {
  const section = (await readDoc("browser.md")).split(/^## /m).find((s) =>
    s.startsWith("Import by URL")
  );
  assert.ok(section, 'docs/browser.md has its "Import by URL" section');
  const command = (pattern: RegExp) => {
    const line = shellLines(section).find((l) => pattern.test(l));
    assert.ok(line, `docs/browser.md shows a command matching ${pattern}`);
    return line;
  };
  const fileName = section.match(/Save this as `([\w.]+\.ts)`/)?.[1];
  const source = section.match(/```ts ignore\n([\s\S]*?)```/)?.[1];
  assert.ok(fileName && source, "docs/browser.md shows the module to save, and its name");
  return {
    serve: command(/^deno run .*examples\/web\/serve\.ts$/),
    client: command(new RegExp(`^deno run .*--allow-import=\\S+ ${fileName}$`)),
    fileName,
    source,
  };
}

/** A TCP port nothing listens on right now. */
function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr as Deno.NetAddr;
  listener.close();
  return port;
}

Deno.test({
  name:
    "docs/browser.md: the URL import runs as written (serve.ts, the module, deno run --allow-import)",
  ...GPU_TEST,
  async fn() {
    const { serve, client, fileName, source } = await readmeUrlImport();
    // As written, on a free port instead of 8000 (another program may hold that one).
    const port = String(freePort());
    const onPort = (text: string) => text.replaceAll("127.0.0.1:8000", `127.0.0.1:${port}`);
    assert.ok(source.includes("http://127.0.0.1:8000/mod.ts") && client.includes(":8000"));
    const env = {
      XDG_RUNTIME_DIR: Deno.env.get("XDG_RUNTIME_DIR") ?? "/tmp",
      DENO_WEBGPU_BACKEND: "vulkan,metal,dx12",
      NO_COLOR: "1",
    };
    const server = new Deno.Command(Deno.execPath(), {
      args: [...serve.split(/\s+/).slice(1), "--port", port],
      cwd: ROOT,
      env,
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    const dir = await Deno.makeTempDir();
    try {
      // It prints its address once it listens.
      let printed = "";
      for await (const chunk of server.stdout.pipeThrough(new TextDecoderStream())) {
        printed += chunk;
        if (printed.includes(`127.0.0.1:${port}/mod.ts`)) break;
      }
      assert.match(printed, /serving this checkout/);
      await Deno.writeTextFile(join(dir, fileName), onPort(source));
      const out = await new Deno.Command(Deno.execPath(), {
        args: onPort(client).split(/\s+/).slice(1),
        cwd: dir, // any folder: no deno.json there
        env,
        stdout: "piped",
        stderr: "piped",
      }).output();
      const stdout = new TextDecoder().decode(out.stdout);
      const stderr = new TextDecoder().decode(out.stderr);
      assert.equal(out.code, 0, `${client}\n${stderr.slice(-2000)}`);
      assert.ok(stderr.includes(`Download http://127.0.0.1:${port}/mod.ts`), "it came over HTTP");
      const losses = stdout.match(/loss (\d\.\d+) → (\d\.\d+)/);
      assert.ok(losses, `it prints the loss: ${stdout}`);
      assert.ok(Number(losses[2]) < Number(losses[1]), `the loss falls: ${losses[0]}`);
    } finally {
      server.kill("SIGTERM");
      await server.status;
      await Deno.remove(dir, { recursive: true });
    }
  },
});
