/**
 * Running PyTorch from tests: finding a Python that imports torch, and
 * running a script of tests/fixtures/torch/ that prints one JSON object.
 */
import assert from "node:assert/strict";

/** tests/fixtures/torch/, where the Python scripts live. */
export const TORCH_FIXTURES: URL = new URL("./fixtures/torch/", import.meta.url);

/**
 * A Python that imports torch: $HALFSTEP_TORCH_PYTHON, else `python3` on the
 * PATH, else Debian's /usr/bin/python3 (where python3-torch installs), or null.
 */
export function torchPython(): string | null {
  const candidates = [Deno.env.get("HALFSTEP_TORCH_PYTHON"), "python3", "/usr/bin/python3"];
  for (const python of candidates) {
    if (!python) continue;
    try {
      const args = ["-c", "import torch"];
      if (new Deno.Command(python, { args, stderr: "null" }).outputSync().success) return python;
    } catch {
      // Not installed: try the next one.
    }
  }
  return null;
}

/**
 * Runs `script` (a file of tests/fixtures/torch/) with `args` under a Python
 * that has torch and returns what it printed, parsed as JSON. Fails (never
 * skips) when no such Python exists: CI installs python3-torch.
 */
export async function runTorchScript(script: string, args: string[]): Promise<unknown> {
  const python = torchPython();
  assert.ok(
    python !== null,
    "PyTorch is missing: install python3-torch (Debian) or point HALFSTEP_TORCH_PYTHON at a " +
      "python with torch",
  );
  const path = new URL(script, TORCH_FIXTURES).pathname;
  const run = await new Deno.Command(python, { args: ["-B", path, ...args] }).output();
  const stderr = new TextDecoder().decode(run.stderr);
  assert.ok(run.success, `${script} ${args[0]} failed:\n${stderr.slice(-2000)}`);
  return JSON.parse(new TextDecoder().decode(run.stdout));
}
