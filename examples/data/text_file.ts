/**
 * A text the examples train on (`--data`): read as UTF-8, with the exit
 * statuses every example gives — a file that cannot be read is a
 * RunFileError (exit status 1, as an unreadable `--weights` or `--resume`),
 * one that is not UTF-8 text a UsageError (exit status 2: a file that is not
 * what the flag takes).
 *
 * @module
 */
import { reason, UsageError } from "../cli/flags.ts";
import { RunFileError } from "../runs/run_file.ts";

/** The text of `--flag path`, or a RunFileError / UsageError of one line (see above). */
export async function readUtf8(flag: string, path: string): Promise<string> {
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (e) {
    throw new RunFileError(`--${flag} ${path}: cannot be read (${reason(e).split("\n")[0]}).`);
  }
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new UsageError(`--${flag} ${path}: it is not UTF-8 text.`);
  }
}
