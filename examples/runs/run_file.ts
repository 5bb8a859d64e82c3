/**
 * What the examples check with a saved training run before any start-up
 * work, from the file's header alone (a GPT-2 run file is gigabytes; the
 * full load, which verifies every checksum, comes later): a `--resume` file
 * that is missing, not a training state, or without this script's record of
 * the run (from `to_halfstep.py`, or `saveTrainingState` without the
 * script's `extra`); and `--save` as an output that would replace a file
 * the user did not ask to replace.
 *
 * @module
 */
import { reason } from "../cli/flags.ts";
import type { OutputFile } from "./outputs.ts";

/** A file problem: the script prints the message and exits with status 1. */
export class RunFileError extends Error {}

/** What a script keeps in a training state's `extra`, and how it speaks of it. */
export interface RunRecordKind<R> {
  /** The script's file name ("mnist.ts"). */
  script: string;
  /** What its record holds, for messages ("epoch, step, data order"). */
  holds: string;
  /** The record in a parsed `extra`, or null when it is not this script's. */
  recordOf(extra: unknown): R | null;
  /** Where a record stands, for messages ("epoch 1, step 8"). */
  describe(record: R): string;
  /** When a run given `--overwrite` replaces the file ("after the first good epoch"). */
  replaced: string;
}

/** A safetensors header longer than this is not read (safetensors' own bound). */
const MAX_HEADER_BYTES = 100_000_000;

/** Exactly `bytes.length` bytes from `file`, or fewer at its end. */
async function readFully(file: Deno.FsFile, bytes: Uint8Array): Promise<number> {
  let got = 0;
  while (got < bytes.length) {
    const n = await file.read(bytes.subarray(got));
    if (n === null) break;
    got += n;
  }
  return got;
}

/** The header's `__metadata__` of a safetensors file, or a RunFileError saying why not. */
export async function metadataOf(path: string, flag: string): Promise<Record<string, string>> {
  let file: Deno.FsFile;
  try {
    file = await Deno.open(path, { read: true });
  } catch (e) {
    const why = e instanceof Deno.errors.NotFound ? "no such file" : reason(e);
    throw new RunFileError(`--${flag} ${path}: ${why.split("\n")[0].slice(0, 200)}`);
  }
  const damaged = new RunFileError(
    `--${flag} ${path}: not a safetensors file (no readable header)`,
  );
  try {
    const head = new Uint8Array(8);
    if (await readFully(file, head) < 8) throw damaged;
    const length = new DataView(head.buffer).getBigUint64(0, true);
    if (length > BigInt(MAX_HEADER_BYTES)) throw damaged;
    const text = new Uint8Array(Number(length));
    if (await readFully(file, text) < text.length) throw damaged;
    const metadata = JSON.parse(new TextDecoder().decode(text)).__metadata__ ?? {};
    if (
      typeof metadata !== "object" || Object.values(metadata).some((v) => typeof v !== "string")
    ) {
      throw damaged;
    }
    return metadata;
  } catch (e) {
    throw e instanceof RunFileError ? e : damaged;
  } finally {
    file.close();
  }
}

/** Whether a file's metadata is a halfstep training state's. */
export function isTrainingState(metadata: Record<string, string>): boolean {
  return /^halfstep-(training-state|checkpoint)-\d+$/.test(metadata.format ?? "");
}

/** The record of `kind` in a training state's metadata, or null when it holds none. */
function recordIn<R>(metadata: Record<string, string>, kind: RunRecordKind<R>): R | null {
  try {
    return kind.recordOf(JSON.parse(metadata.extra ?? "null"));
  } catch {
    return null; // not JSON: not a record
  }
}

/**
 * The run record of `--resume`, read before any start-up work: a missing
 * file, one that is not a training state, or a training state without the
 * script's record is a RunFileError of one line.
 */
export async function readRunRecord<R>(path: string, kind: RunRecordKind<R>): Promise<R> {
  const metadata = await metadataOf(path, "resume");
  if (!isTrainingState(metadata)) {
    throw new RunFileError(
      `--resume ${path}: not a halfstep training state (a model file? load it with loadModule).`,
    );
  }
  const record = recordIn(metadata, kind);
  if (!record) {
    throw new RunFileError(
      `--resume ${path}: a training state without ${kind.script}'s record of the run ` +
        `(${kind.holds}), so it cannot continue here; it was saved by another program.`,
    );
  }
  return record;
}

/**
 * `--save` as an output of the one rule (examples/runs/outputs.ts): it may be
 * the `--resume` file it goes on saving; any other file there is refused
 * unless `--overwrite` is given, with a message that says what the file
 * holds.
 */
export function saveOutput<R>(
  flags: { save: string; resume?: string },
  kind: RunRecordKind<R>,
): OutputFile {
  const { save, resume } = flags;
  return {
    flag: "save",
    path: save,
    continues: resume,
    async refusal() {
      const metadata = await metadataOf(save, "save").catch(() => null);
      const state = metadata !== null && isTrainingState(metadata);
      const record = state ? recordIn(metadata, kind) : null;
      const holds = record
        ? `holds a saved run (${kind.describe(record)})`
        : state
        ? "holds a saved training state"
        : "already exists";
      const resumeIt = record ? `continue it with --resume ${save}, or ` : "";
      return `--save ${save} ${holds}; ${resumeIt}add --overwrite to start over (the file is ` +
        `replaced ${kind.replaced}).`;
    },
  };
}

/** {@link readRunRecord} of `--resume`, or null; a file that cannot continue exits with status 1. */
export async function readRecordOrExit<R>(
  script: string,
  resume: string | undefined,
  kind: RunRecordKind<R>,
): Promise<R | null> {
  if (!resume) return null;
  try {
    return await readRunRecord(resume, kind);
  } catch (e) {
    if (!(e instanceof RunFileError)) throw e;
    console.error(`${script}: cannot resume: ${e.message}`);
    Deno.exit(1);
  }
}
