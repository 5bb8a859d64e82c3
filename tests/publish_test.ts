/**
 * JSR readiness: `deno publish --dry-run` (which runs offline) passes with no
 * warnings, finds no slow types, and ships the library alone: mod.ts and its
 * three layers, never tests, examples or CI scripts.
 */
import assert from "node:assert/strict";
import { ROOT } from "./_bundle.ts";

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
  assert.doesNotMatch(output, /warning|error/i, output);
  // "   file:///…/repo/gpu/mod.ts (2.4KB)" → "gpu/mod.ts"
  const root = new URL(`file://${ROOT}`).href;
  const shipped = output.split("\n").filter((line) => line.includes(root))
    .map((line) => line.trim().slice(root.length).replace(/ \(.*\)$/, ""));
  for (
    const file of ["mod.ts", "gpu/mod.ts", "amp/mod.ts", "nn/mod.ts", "nn/files.ts", "README.md"]
  ) {
    assert.ok(shipped.includes(file), `${file} is published: ${shipped}`);
  }
  const stray = shipped.filter((file) => /^(tests|examples|\.ci|dist)\//.test(file));
  assert.deepEqual(stray, [], "only the library is published");
});
