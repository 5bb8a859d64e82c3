/**
 * JSR readiness: `deno publish --dry-run` (which runs offline) passes with no
 * warnings, finds no slow types, and ships the library alone: mod.ts and its
 * three layers, never tests, examples or CI scripts.
 */
import assert from "node:assert/strict";
import { ROOT } from "../helpers/bundle.ts";

Deno.test("deno publish --dry-run: no slow types, no warnings, the library files only", async () => {
  const run = await new Deno.Command(Deno.execPath(), {
    args: ["publish", "--dry-run", "--allow-dirty"],
    cwd: ROOT,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const output = new TextDecoder().decode(run.stdout) + new TextDecoder().decode(run.stderr);
  assert.equal(run.code, 0, output);
  assert.match(output, /Checking for slow types in the public API/);
  assert.match(output, /Dry run complete/);
  // The file list names files such as gpu/base/errors.ts: look for warnings everywhere else.
  const messages = output.split("\n").filter((line) => !line.includes("file://")).join("\n");
  assert.doesNotMatch(messages, /warning|error/i, output);
  // "   file:///…/repo/gpu/mod.ts (2.4KB)" → "gpu/mod.ts"
  const root = new URL(`file://${ROOT}`).href;
  const shipped = output.split("\n").filter((line) => line.includes(root))
    .map((line) => line.trim().slice(root.length).replace(/ \(.*\)$/, ""));
  const entries = ["mod.ts", "files.ts", "gpu/mod.ts", "optim/mod.ts", "nn/mod.ts", "amp/mod.ts"];
  for (const file of [...entries, "README.md"]) {
    assert.ok(shipped.includes(file), `${file} is published: ${shipped}`);
  }
  const stray = shipped.filter((file) => /^(tests|examples|\.ci|dist)\//.test(file));
  assert.deepEqual(stray, [], "only the library is published");
});
