/**
 * The one rule for every file an example writes (a training run, GPT-2
 * weights, a nanoGPT export, a plot, a heat map), checked before any work:
 * it can be written (permission, an existing folder that takes a new file,
 * not a folder), it is none of the files the run reads, no two outputs name
 * one file, and a file already there is replaced only when the user said so
 * (`--overwrite`, or `--resume` of the run that wrote it). After writing, the
 * script says what it wrote ("saved PATH (...)", "wrote PATH"). The Python
 * tools keep the same rule in examples/torch/halfstep_run.py
 * (`check_output`).
 *
 * @module
 */
import { resolve } from "node:path";
import { linkTarget } from "../../files.ts";
import { checkOutputPath, UsageError } from "../cli/flags.ts";

/** A file the run writes. */
export interface OutputFile {
  /** The flag that names it ("save-weights"); a file written beside another names that one's. */
  flag: string;
  path: string;
  /** What the file is, when not the flag's own file ("the heat map beside it"). */
  what?: string;
  /** The run file this output goes on saving (`--resume`'s): it may be that file. */
  continues?: string;
  /** True when a file there may be replaced without `--overwrite` (a resumed run's own plot). */
  replaceable?: boolean;
  /** The refusal when a file is there and may not be replaced (default: it exists). */
  refusal?: () => Promise<string>;
}

/** A file the run reads. */
export interface InputFile {
  flag: string;
  path: string;
}

/** Whether something (a file, a folder, a link) is at `path`. */
export function exists(path: string): Promise<boolean> {
  return Deno.lstat(path).then(() => true, () => false);
}

/**
 * Whether `a` and `b` name one file: the same inode where both exist
 * (through links, `./`, folders' links), else the same path once links are
 * followed.
 */
export async function sameFile(a: string, b: string): Promise<boolean> {
  try {
    const [x, y] = await Promise.all([Deno.stat(a), Deno.stat(b)]);
    if (x.ino !== null && y.ino !== null) return x.dev === y.dev && x.ino === y.ino;
  } catch {
    // one is not there (yet): compare the paths
  }
  return resolve(await linkTarget(a)) === resolve(await linkTarget(b));
}

/** `--flag PATH`, or `--flag PATH's what` for a file written beside it. */
function named(output: OutputFile): string {
  return output.what ? `${output.what} ${output.path} (of --${output.flag})` : (
    `--${output.flag} ${output.path}`
  );
}

/**
 * Throws a UsageError unless every output can be written where it is named
 * (see `checkOutputPath`). Run it before any work, and before taking a lock
 * beside an output, so a bad path costs nothing.
 */
export async function checkOutputsWritable(outputs: readonly OutputFile[]): Promise<void> {
  for (const output of outputs) await checkOutputPath(output.flag, output.path);
}

/**
 * Throws a UsageError when an output is one of `inputs` (never allowed: the
 * run would replace what it reads), when two outputs name one file, or when
 * a file is there and neither `overwrite` nor the output allows replacing it.
 */
export async function checkOutputsReplace(
  outputs: readonly OutputFile[],
  options: { inputs: readonly InputFile[]; overwrite: boolean },
): Promise<void> {
  for (const [i, output] of outputs.entries()) {
    const continued = output.continues !== undefined &&
      await sameFile(output.continues, output.path);
    for (const input of options.inputs) {
      if (continued && await sameFile(input.path, output.continues!)) continue;
      if (await sameFile(input.path, output.path)) {
        throw new UsageError(
          `${named(output)} is the file of --${input.flag}, which this run reads: writing it ` +
            "would replace it; give another path.",
        );
      }
    }
    for (const other of outputs.slice(0, i)) {
      if (await sameFile(other.path, output.path)) {
        throw new UsageError(
          `${named(other)} and ${named(output)} name one file; give each its own path.`,
        );
      }
    }
    if (continued || output.replaceable || options.overwrite || !(await exists(output.path))) {
      continue;
    }
    throw new UsageError(
      output.refusal ? await output.refusal() : (
        `${named(output)} already exists; add --overwrite to replace it, or give another path.`
      ),
    );
  }
}

/** {@link checkOutputsWritable}, then {@link checkOutputsReplace}: the whole rule at once. */
export async function checkOutputFiles(
  outputs: readonly OutputFile[],
  options: { inputs: readonly InputFile[]; overwrite: boolean },
): Promise<void> {
  await checkOutputsWritable(outputs);
  await checkOutputsReplace(outputs, options);
}
