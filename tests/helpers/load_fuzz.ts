/**
 * The driver of the loader fuzz tests: loads each mutant (tests/helpers/file_mutations.ts)
 * into a live target and collects every broken rule. A failed load must be one
 * short HalfstepError line that changes nothing (checked in batches, one GPU
 * wait each, and always before a load that may succeed); a load that succeeds
 * must give exactly the saved state; with checksums nothing but harmless
 * changes may load, without them no structural change may.
 */
import { isDeepStrictEqual } from "node:util";
import { HalfstepError } from "../../gpu/base/errors.ts";
import { decodeSafetensors } from "../../nn/safetensors.ts";
import { type Mutant, splitFile } from "./file_mutations.ts";

/** Mutation kinds that change a file's structure: they must fail even without checksums. */
export const STRUCTURAL_KINDS: ReadonlySet<string> = new Set([
  "length-bit",
  "shape-edit",
  "json-drop-key",
  "rename",
  "truncate",
  "append",
]);

/** What a fuzz run loads into. Snapshots are plain records compared deeply (bytes included). */
export interface LoadTarget {
  /** The loader under test, reading `path` into the target. */
  load(path: string): Promise<unknown>;
  /** The target's whole state (a GPU wait at most). */
  snapshot(): Promise<Record<string, unknown>>;
  /** Puts the target back to its state before the run (after a load that succeeded). */
  restore(): Promise<void>;
  /** What a successful load returned that differs from the saved file's (names; default none). */
  wrongResult?(result: unknown): string[];
}

/** Options of {@link fuzzLoads}. */
export interface FuzzOptions {
  /** The state a successful load must give. */
  saved: Record<string, unknown>;
  /** True when the mutants come from a file with checksums. */
  checksums: boolean;
  /** Mutation kinds that must fail even without checksums (default {@link STRUCTURAL_KINDS}). */
  structural?: ReadonlySet<string>;
  /** Failed loads between two checks (default 50). */
  batch?: number;
}

/** Keys whose values differ between two snapshots. */
export function differences(a: Record<string, unknown>, b: Record<string, unknown>): string[] {
  return Object.keys(a).filter((key) => !isDeepStrictEqual(a[key], b[key]));
}

function decodes(bytes: Uint8Array): boolean {
  try {
    decodeSafetensors(bytes);
    return true;
  } catch {
    return false;
  }
}

function hasChecksums(bytes: Uint8Array): boolean {
  try {
    const metadata = splitFile(bytes).header.__metadata__ as Record<string, unknown> | undefined;
    return metadata !== undefined && Object.hasOwn(metadata, "halfstep.checksums");
  } catch {
    return false;
  }
}

/**
 * Loads every mutant into `target` through a file in `dir`.
 *
 * @returns The broken rules, one line each, and how many mutants loaded and failed.
 */
export async function fuzzLoads(
  dir: string,
  target: LoadTarget,
  mutants: Iterable<Mutant>,
  options: FuzzOptions,
): Promise<{ violations: string[]; loaded: number; failed: number }> {
  const initial = await target.snapshot();
  const violations: string[] = [];
  let pending: string[] = [], loaded = 0, failed = 0;
  const checkUnchanged = async () => {
    const changed = differences(initial, await target.snapshot());
    if (changed.length > 0) {
      violations.push(`failed loads changed ${changed.join(", ")}; one of: ${pending.join("; ")}`);
    }
    pending = [];
  };
  const path = `${dir}/mutant.safetensors`;
  for (const m of mutants) {
    const what = `${m.kind} (${m.detail.slice(0, 80)})`;
    await Deno.writeFile(path, m.bytes);
    // A load that succeeds overwrites the target: check the failures before it first.
    if (pending.length > 0 && decodes(m.bytes)) await checkUnchanged();
    let result: unknown;
    try {
      result = await target.load(path);
    } catch (err) {
      failed++;
      if (m.neutral) violations.push(`${what} is harmless but failed: ${err}`);
      const message = (err as Error).message ?? "";
      if (!(err instanceof HalfstepError)) violations.push(`${what}: not a HalfstepError: ${err}`);
      else if (message.includes("\n") || message.length > 300) {
        violations.push(`${what}: not one short line (${message.length} chars): ${message}`);
      }
      pending.push(what);
      if (pending.length >= (options.batch ?? 50)) await checkUnchanged();
      continue;
    }
    loaded++;
    const wrong = [
      ...differences(options.saved, await target.snapshot()),
      ...(target.wrongResult?.(result) ?? []),
    ];
    const mustFail = !m.neutral &&
      (options.checksums
        ? hasChecksums(m.bytes) || wrong.length > 0
        : (options.structural ?? STRUCTURAL_KINDS).has(m.kind));
    if (mustFail) violations.push(`${what} loaded${wrong.length ? `: ${wrong.join(", ")}` : ""}`);
    else if (options.checksums && wrong.length > 0) violations.push(`${what} loaded other values`);
    await target.restore();
  }
  await checkUnchanged();
  return { violations, loaded, failed };
}
