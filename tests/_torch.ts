/** Running PyTorch from a test: find a Python that imports torch, run a script on it. */

/**
 * A Python that imports torch: $HALFSTEP_TORCH_PYTHON, else `python3` on the
 * PATH, else Debian's /usr/bin/python3 (where python3-torch installs), or null.
 */
function findTorchPython(): string | null {
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

/** The Python that imports torch, or null (tests that need it are ignored, saying so). */
export const TORCH_PYTHON: string | null = findTorchPython();

/**
 * `Deno.test`'s name and ignore for a test that needs PyTorch: where no
 * {@link TORCH_PYTHON} is found it is ignored, and its name says why.
 */
export function needsTorch(name: string): { name: string; ignore: boolean } {
  if (TORCH_PYTHON) return { name, ignore: false };
  return { name: `${name} (needs python3 with torch)`, ignore: true };
}

/**
 * Runs `script` on {@link TORCH_PYTHON} with `options.args` (its sys.argv[1:]) and
 * `options.stdin` as its input: its stdout, or an error with its stderr.
 */
export async function runTorch(
  script: string,
  options: { args?: string[]; stdin?: string } = {},
): Promise<string> {
  const child = new Deno.Command(TORCH_PYTHON!, {
    args: ["-c", script, ...(options.args ?? [])],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(options.stdin ?? ""));
  await writer.close();
  const { success, stdout, stderr } = await child.output();
  const text = new TextDecoder();
  if (!success) throw new Error(`python failed: ${text.decode(stderr).slice(-2000)}`);
  return text.decode(stdout);
}
