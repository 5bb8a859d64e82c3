/**
 * The README's commands run as written on a fresh clone: every `deno run` and
 * `deno task demo` line of its shell blocks, in order, with size flags added
 * so each takes seconds (`--limit 512 --epochs 1` for MNIST, a few steps for
 * the GPT) and its output files moved to a temporary folder.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "./_bundle.ts";
import { readReadme, shellLines } from "./_readme.ts";

/** Every `deno` command line of the README's ```sh blocks (comments stripped). */
async function readmeCommands(): Promise<string[]> {
  return shellLines(await readReadme()).filter((line) => line.startsWith("deno "));
}

/** The flags that make a README command quick, by the script it runs. */
function quickFlags(command: string): string[] | null {
  if (command === "deno task demo" || command.includes("examples/mnist.ts")) {
    return ["--limit", "512", "--epochs", "1"];
  }
  if (command.includes("examples/tiny_gpt.ts")) {
    return ["--steps", "4", "--eval-windows", "32", "--samples", "2"];
  }
  return null; // `deno task test`, `deno task web`: not examples
}

Deno.test("README: every example command runs as written", async () => {
  const commands = await readmeCommands();
  const examples = commands.filter((c) => quickFlags(c) !== null);
  assert.ok(examples.length >= 5, `the README shows the examples (${commands.join(" | ")})`);
  assert.ok(commands.includes("deno task demo") && commands.includes("deno task test"));
  const dir = await Deno.makeTempDir();
  try {
    for (const command of examples) {
      // Output files land in the temporary folder; everything else is as written.
      const words = command.split(/\s+/).map((w) =>
        /\.(safetensors|svg)$/.test(w) ? join(dir, w) : w
      );
      const out = await new Deno.Command(Deno.execPath(), {
        args: [...words.slice(1), ...quickFlags(command)!],
        cwd: ROOT,
        // The README's commands are the builtin backend's (docs/dawn.md has Dawn's), also on
        // the suite's Dawn pass.
        env: {
          NO_COLOR: "1",
          DENO_WEBGPU_BACKEND: "vulkan,metal,dx12",
          HALFSTEP_BACKEND: "builtin",
        },
        stdout: "piped",
        stderr: "piped",
      }).output();
      const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
      assert.equal(out.code, 0, `${command}\n${text}`);
      assert.doesNotMatch(text, /NaN%|Infinity|error/i, command);
    }
    const files = [];
    for await (const e of Deno.readDir(dir)) files.push(e.name);
    assert.deepEqual(files.sort(), ["gpt.svg", "loss.svg", "run.safetensors"]);
  } finally {
    await Deno.remove(dir, { recursive: true });
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
