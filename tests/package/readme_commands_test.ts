/**
 * The README and the guides as a newcomer meets them: every `deno run` and
 * `deno task demo` line of their shell blocks runs as written on a fresh
 * clone (document by document, in order, with size flags added so each
 * takes seconds: `--limit 512 --epochs 1` for MNIST, a few steps for the
 * GPT, and its output files moved to a temporary folder); the README stays
 * a page or two that says where the snippets run and lists every guide (that
 * each snippet checks its results with node:assert/strict is
 * doc_examples_test.ts's rule).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "../helpers/bundle.ts";
import { readDocs, readReadme, shellLines } from "../helpers/readme.ts";

/** The flags that make a command quick, by the script it runs (null: not an example to run). */
function quickFlags(command: string): string[] | null {
  // Dawn's commands (docs/dawn.md) need Mesa 26's lavapipe here: tests/gpu/device/dawn_backend_test.ts runs
  // mnist --amp --backend dawn on the suite's Dawn pass.
  if (/--backend[ =]dawn\b/.test(command)) return null;
  if (command === "deno task demo" || command.includes("examples/mnist.ts")) {
    return ["--limit", "512", "--epochs", "1"];
  }
  if (command.includes("examples/tiny_gpt.ts")) {
    return ["--steps", "4", "--eval-windows", "32", "--samples", "2"];
  }
  return null; // `deno task test`, `deno task web`, servers, benchmarks: not examples
}

/** Runs a document's example commands in `dir`; the files they wrote. */
async function runCommands(path: string, text: string, dir: string): Promise<string[]> {
  const examples = shellLines(text).filter((l) => l.startsWith("deno ") && quickFlags(l));
  for (const command of examples) {
    // Output files land in the temporary folder; everything else is as written.
    const words = command.split(/\s+/).map((w) =>
      /\.(safetensors|svg)$/.test(w) ? join(dir, w) : w
    );
    const out = await new Deno.Command(Deno.execPath(), {
      args: [...words.slice(1), ...quickFlags(command)!],
      cwd: ROOT,
      // The documents' commands are the builtin backend's (docs/dawn.md has Dawn's), also on
      // the suite's Dawn pass.
      env: { NO_COLOR: "1", DENO_WEBGPU_BACKEND: "vulkan,metal,dx12", HALFSTEP_BACKEND: "builtin" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const output = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, `${path}: ${command}\n${output}`);
    assert.doesNotMatch(output, /NaN%|Infinity|error(?!: XDG_RUNTIME_DIR)/i, `${path}: ${command}`);
  }
  const files = [];
  for await (const e of Deno.readDir(dir)) files.push(e.name);
  return files.sort();
}

Deno.test("README: every example command runs as written", async () => {
  const readme = await readReadme();
  const commands = shellLines(readme).filter((line) => line.startsWith("deno "));
  assert.ok(commands.includes("deno task demo") && commands.includes("deno task test"));
  const examples = commands.filter((c) => quickFlags(c) !== null);
  assert.ok(examples.length >= 5, `the README shows the examples (${commands.join(" | ")})`);
  const dir = await Deno.makeTempDir();
  try {
    const files = await runCommands("README.md", readme, dir);
    assert.deepEqual(files, ["gpt.svg", "loss.svg", "run.safetensors"]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("guides: every example command in docs/ runs as written", async () => {
  const guides = (await readDocs()).filter((d) => d.path !== "README.md");
  for (const { path, text } of guides) {
    const dir = await Deno.makeTempDir();
    try {
      await runCommands(path, text, dir);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("README: a page or two that says where snippets run and lists every guide", async () => {
  const readme = await readReadme();
  const lines = readme.split("\n").length;
  assert.ok(lines < 250, `README.md has ${lines} lines; move details to a guide in docs/`);
  assert.match(readme, /snippet in this README and in `docs\/` runs from the checkout's root/);
  const guides = (await readDocs()).map((d) => d.path).filter((p) => p.startsWith("docs/"));
  const listed = readme.split(/^## /m).find((s) => s.startsWith("Guides"));
  assert.ok(listed, 'the README has a "Guides" section');
  for (const guide of guides) assert.ok(listed.includes(`(${guide})`), `Guides lists ${guide}`);
  for (const changelog of [/previous release/i, /before this round/i, /\bwas \d+(\.\d+)?% /]) {
    assert.doesNotMatch(readme, changelog, "no changelog passages");
  }
});

Deno.test("README: install lines as CI runs them (apt-get as root, no sudo), same packages", async () => {
  const readme = await readReadme();
  const ci = await Deno.readTextFile(join(ROOT, ".ci", "run"));
  // CI runs as root, where sudo is often missing; users add it themselves.
  assert.doesNotMatch(readme, /\bsudo\s+apt/, "no sudo in the README's install lines");
  const installed = [...readme.matchAll(/apt-get install -y ([\w-]+(?: [\w-]+)*)/g)]
    .flatMap((m) => m[1].split(" "));
  assert.deepEqual(installed.sort(), ["chromium", "mesa-vulkan-drivers"]);
  for (const name of installed) assert.match(ci, new RegExp(`packages\\+=\\(${name}\\)`), name);
});

Deno.test("guides: every --data file a command names is there (docs/gpt2.md's CPU run named a COPYING the checkout lacks), my.txt standing for the reader's own text", async () => {
  for (const { path, text } of await readDocs()) {
    for (const line of shellLines(text)) {
      for (const [, file] of line.matchAll(/--data[ =](\S+)/g)) {
        if (file === "my.txt") continue; // "your text", as the guides say
        const at = file.startsWith("/") ? file : join(ROOT, file);
        assert.ok(
          await Deno.stat(at).then((s) => s.isFile, () => false),
          `${path}: --data ${file} is not there (${line})`,
        );
      }
    }
  }
});
