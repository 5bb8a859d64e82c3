/**
 * Running PyTorch from a test. Tests that need it fail, never skip, where no
 * Python has torch: CI installs python3-torch, so every comparison with
 * PyTorch runs there.
 */
import { findTorchPython } from "../../examples/cli/torch_python.ts";

let found: string | null | undefined;

/** The Python that imports torch; throws, saying how to install it, where there is none. */
export function torchPython(): string {
  found ??= findTorchPython();
  if (found === null) {
    throw new Error(
      "PyTorch is missing: install python3-torch (Debian; .ci/run does) or point " +
        "HALFSTEP_TORCH_PYTHON at a python with torch",
    );
  }
  return found;
}

/**
 * Runs `args` (a script's path and its arguments, or `-c` and a program) on
 * {@link torchPython} with `stdin` as its input: its stdout, or an error with
 * the end of its stderr.
 */
export async function runPython(args: string[], stdin = ""): Promise<string> {
  const child = new Deno.Command(torchPython(), {
    args: ["-B", ...args],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(stdin));
  await writer.close();
  const { success, stdout, stderr } = await child.output();
  const text = new TextDecoder();
  if (!success) throw new Error(`${args[0]} failed:\n${text.decode(stderr).slice(-3000)}`);
  return text.decode(stdout);
}

/**
 * Runs the Python program `script` with `options.args` (its sys.argv[1:]) and
 * `options.stdin` as its input: its stdout.
 */
export function runTorch(
  script: string,
  options: { args?: string[]; stdin?: string } = {},
): Promise<string> {
  return runPython(["-c", script, ...(options.args ?? [])], options.stdin);
}

/** One training step as halfstep and the PyTorch tools log it. */
export interface LoggedStep {
  step: number;
  loss: number;
  lr: number;
}

/**
 * Asserts two logs of the same step agree: the learning rate to 1e-12
 * (both compute base · schedule(step) in f64), the loss within `tolerance`.
 * Returns the loss gap.
 */
export function assertSameStep(
  got: LoggedStep,
  want: LoggedStep,
  tolerance: number,
  what: string,
): number {
  if (!(Math.abs(got.lr - want.lr) <= 1e-12 * want.lr)) {
    throw new Error(`${what}: lr at step ${got.step}: ${got.lr} vs ${want.lr}`);
  }
  const gap = Math.abs(got.loss - want.loss);
  if (!(gap <= tolerance)) {
    throw new Error(
      `${what}: loss at step ${got.step}: ${got.loss} vs ${want.loss} (tolerance ${tolerance})`,
    );
  }
  return gap;
}
