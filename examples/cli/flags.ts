/**
 * What the examples' command lines share: strict number parsing with a
 * message that says what is allowed, negative values after a flag, and a
 * check that an output path can be written before any training starts.
 */

import { dirname } from "node:path";
import { parseArgs, type ParseArgsConfig } from "node:util";

/** A bad flag value; the example prints its message and exits with status 2. */
export class UsageError extends Error {}

/** The edit distance between `a` and `b` (insertions, deletions, substitutions). */
function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    row = next;
  }
  return row[b.length];
}

/** The known flag closest to `flag` (a typo: at most 2 edits, or a prefix), if any. */
export function closestFlag(flag: string, known: readonly string[]): string | undefined {
  const ranked = known.map((k) => ({ k, d: editDistance(flag, k) })).sort((a, b) => a.d - b.d);
  const prefix = known.filter((k) => k.startsWith(flag) || flag.startsWith(k));
  if (ranked[0] && ranked[0].d <= Math.min(2, Math.floor(flag.length / 2))) return ranked[0].k;
  return prefix.length === 1 ? prefix[0] : undefined;
}

/**
 * node's `parseArgs` with its errors as UsageErrors in the examples' words:
 * an unknown flag names the closest known one (`--epoch`: did you mean
 * `--epochs`?).
 */
export function parseFlags<T extends ParseArgsConfig>(config: T): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config);
  } catch (e) {
    if (!(e instanceof TypeError)) throw e;
    const unknown = /^Unknown option '(-{1,2})([^']*)'/.exec(e.message);
    if (!unknown) throw new UsageError(e.message, { cause: e });
    const name = unknown[2].split("=")[0];
    const near = closestFlag(name, Object.keys(config.options ?? {}));
    throw new UsageError(
      `unknown flag ${unknown[1]}${name.slice(0, 40)}${near ? `; did you mean --${near}?` : ""}`,
      { cause: e },
    );
  }
}

const INTEGER = /^[+-]?\d+$/;
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

/**
 * `check()`, or, when it throws a UsageError, its message as one line
 * `script: message` on stderr and exit status 2 (other errors pass through).
 */
export function orExit<T>(script: string, check: () => T): T {
  try {
    return check();
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    console.error(`${script}: ${e.message}`);
    Deno.exit(2);
  }
}

/** {@link orExit} for a check that waits (reads a file, say). */
export async function orExitAsync<T>(script: string, check: () => Promise<T>): Promise<T> {
  try {
    return await check();
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    console.error(`${script}: ${e.message}`);
    Deno.exit(2);
  }
}

/**
 * Runs a script's `main`; an error nothing else caught ends it with one line
 * (`script: message`) and exit status 1 instead of a stack trace, and
 * `Deno.exit` lets the `--save` lock go. HALFSTEP_DEBUG=1 shows the stack.
 */
export async function runMain(script: string, main: () => Promise<void>): Promise<void> {
  try {
    await main();
  } catch (e) {
    const debug = Deno.permissions.querySync({ name: "env", variable: "HALFSTEP_DEBUG" });
    if (debug.state === "granted" && Deno.env.get("HALFSTEP_DEBUG")) console.error(e);
    const message = e instanceof Error ? e.message : String(e);
    console.error(`${script}: ${message.split("\n")[0].slice(0, 400)}`);
    Deno.exit(1);
  }
}

/** An integer in [min, max] written in decimal digits (no "0x10", "1e9" or "2.0"). */
export function integerFlag(flag: string, text: string, min: number, max = Infinity): number {
  const n = Number(text);
  if (!INTEGER.test(text.trim()) || !Number.isSafeInteger(n) || n < min || n > max) {
    const range = max === Infinity ? `>= ${min}` : `from ${min} to ${max}`;
    throw new UsageError(`--${flag} must be an integer ${range}, not "${text}".`);
  }
  return n;
}

/** A decimal number (1e-3 allowed, "0x10" not) for which `ok` holds; `want` says what is allowed. */
export function numberFlag(
  flag: string,
  text: string,
  ok: (x: number) => boolean,
  want: string,
): number {
  const x = Number(text);
  if (!DECIMAL.test(text.trim()) || !Number.isFinite(x) || !ok(x)) {
    throw new UsageError(`--${flag} must be ${want}, not "${text}".`);
  }
  return x;
}

/** One of `names`. */
export function choiceFlag<T extends string>(flag: string, text: string, names: readonly T[]): T {
  if (!(names as readonly string[]).includes(text)) {
    const choices = names.length > 1
      ? `${names.slice(0, -1).join(", ")} or ${names.at(-1)}`
      : names.join("");
    throw new UsageError(`--${flag} must be ${choices}, not "${text}".`);
  }
  return text as T;
}

/**
 * `args` with `--flag -3` written as `--flag=-3` for the flags that take a
 * value, so a negative number reaches the flag's own check (node's parseArgs
 * would call it an ambiguous option).
 */
export function withNegativeValues(
  args: readonly string[],
  valueFlags: readonly string[],
): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const flag = args[i], next = args[i + 1];
    if (valueFlags.includes(flag.replace(/^--/, "")) && next !== undefined && /^-\d/.test(next)) {
      out.push(`${flag}=${next}`);
      i++;
    } else out.push(flag);
  }
  return out;
}

/**
 * Throws a UsageError unless a file can be written at `path` (the value of
 * `--flag`): write permission, an existing folder, not a folder itself, and
 * a folder that accepts a new file (probed with a temporary file, removed at
 * once). Run it before training, so a bad path costs no training time.
 */
export async function checkOutputPath(flag: string, path: string): Promise<void> {
  const where = `--${flag} ${path}`;
  const dir = dirname(path);
  const permission = await Deno.permissions.query({ name: "write", path });
  if (permission.state !== "granted") {
    throw new UsageError(`${where}: no permission to write it; run with --allow-write.`);
  }
  const stat = await statOrNull(path, where);
  if (stat?.isDirectory) throw new UsageError(`${where}: it is a folder; give a file name.`);
  const folder = await statOrNull(dir, `${where}: the folder "${dir}"`);
  if (!folder?.isDirectory) {
    throw new UsageError(`${where}: the folder "${dir}" does not exist; create it first.`);
  }
  try {
    const probe = await Deno.makeTempFile({ dir, prefix: ".halfstep-write-check-" });
    await Deno.remove(probe);
  } catch (e) {
    throw new UsageError(`${where}: the folder "${dir}" cannot be written (${reason(e)}).`, {
      cause: e,
    });
  }
}

/** The OS's reason in `e` (permission denied, read-only file system, ...). */
export function reason(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/**
 * `Deno.stat(path)`, or null when nothing is there; any other failure
 * (permission denied, an I/O error) is a UsageError that says so and keeps it as `cause`.
 */
async function statOrNull(path: string, what: string): Promise<Deno.FileInfo | null> {
  try {
    return await Deno.stat(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound || e instanceof Deno.errors.NotADirectory) return null;
    throw new UsageError(`${what} cannot be checked (${reason(e)}).`, { cause: e });
  }
}
