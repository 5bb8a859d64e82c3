/** Running a Python script of tests/fixtures/torch/ that prints one JSON object. */
import { runPython } from "./torch.ts";

/**
 * Runs `script`, a file of tests/fixtures/torch/, with `args` on the Python
 * that has torch and returns what it printed, parsed as JSON. Fails, never
 * skips, when no Python has torch: CI installs python3-torch.
 */
export async function runTorchScript(script: string, args: string[]): Promise<unknown> {
  const path = new URL(`../fixtures/torch/${script}`, import.meta.url).pathname;
  return JSON.parse(await runPython([path, ...args]));
}
