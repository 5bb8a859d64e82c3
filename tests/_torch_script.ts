/** Running a Python script of tests/fixtures/torch/ that prints one JSON object. */
import { TORCH_PYTHON } from "./_torch.ts";

/**
 * Runs `script`, a file of tests/fixtures/torch/, with `args` on the Python
 * that has torch and returns what it printed, parsed as JSON. Fails, never
 * skips, when no Python has torch: CI installs python3-torch.
 */
export async function runTorchScript(script: string, args: string[]): Promise<unknown> {
  if (TORCH_PYTHON === null) {
    throw new Error(
      "PyTorch is missing: install python3-torch (Debian) or point HALFSTEP_TORCH_PYTHON at a " +
        "python with torch",
    );
  }
  const path = new URL(`./fixtures/torch/${script}`, import.meta.url).pathname;
  const run = await new Deno.Command(TORCH_PYTHON, { args: ["-B", path, ...args] }).output();
  const text = new TextDecoder();
  if (!run.success) {
    throw new Error(`${script} ${args[0]} failed:\n${text.decode(run.stderr).slice(-2000)}`);
  }
  return JSON.parse(text.decode(run.stdout));
}
