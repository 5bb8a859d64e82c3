/**
 * A Python that imports torch, for the examples that compare with PyTorch
 * (`bench host`) and for the tests: $HALFSTEP_TORCH_PYTHON, else `python3`
 * on the PATH, else Debian's /usr/bin/python3 (where python3-torch
 * installs).
 */

/**
 * The first of $HALFSTEP_TORCH_PYTHON, `python3` and /usr/bin/python3 that
 * imports torch, or null (none does, or running programs is not allowed).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { findTorchPython } from "./torch_python.ts";
 * const python = findTorchPython();
 * assert.ok(python === null || python.length > 0);
 * ```
 */
export function findTorchPython(): string | null {
  const candidates = [Deno.env.get("HALFSTEP_TORCH_PYTHON"), "python3", "/usr/bin/python3"];
  for (const python of candidates) {
    if (!python) continue;
    try {
      const args = ["-c", "import torch"];
      if (new Deno.Command(python, { args, stderr: "null" }).outputSync().success) return python;
    } catch {
      // Not installed (or not allowed): try the next one.
    }
  }
  return null;
}
