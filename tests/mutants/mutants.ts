/**
 * The planted bugs of `deno task mutants` (mutants.json) and what checks
 * them: each is one exact text of one file, its replacement, the tests
 * expected to fail with it, and why it is a bug. A mutant whose text is not
 * in its file exactly once is refused, so the list cannot silently go stale
 * when the code moves (tests/package/mutants_test.ts checks the whole list).
 */

/** One planted bug. */
export interface Mutant {
  /** A short unique name (kebab-case): what is broken, where. */
  name: string;
  /** The file it is planted in, relative to the repository root. */
  file: string;
  /** Text that occurs exactly once in `file`. */
  find: string;
  /** What replaces it. */
  replace: string;
  /** Test files expected to catch it (relative to the root), run together. */
  tests: string[];
  /** A `deno test --filter` that narrows them to the tests that matter (optional). */
  filter?: string;
  /** One line: why this is a bug a user would meet. */
  why: string;
}

/** Where the list lives, relative to the repository root. */
export const MUTANTS_FILE = "tests/mutants/mutants.json";

/** The fields every mutant must have, as strings (`tests` apart). */
const TEXT_FIELDS = ["name", "file", "find", "replace", "why"] as const;

/** Reads the list from the repository at `root` (or from `file`, a path of its own). */
export async function loadMutants(root: string, file?: string): Promise<Mutant[]> {
  return JSON.parse(await Deno.readTextFile(file ?? `${root}/${MUTANTS_FILE}`));
}

/** How many times `text` occurs in `source` (non-overlapping). */
function occurrences(source: string, text: string): number {
  return text === "" ? 0 : source.split(text).length - 1;
}

/**
 * Everything wrong with `mutants` against the files `read` gives (null: no
 * such file): missing fields, duplicate names, a text not found exactly
 * once, a replacement equal to its text, a test file that does not exist.
 * Empty when every mutant applies.
 */
export function mutantProblems(
  mutants: readonly Mutant[],
  read: (path: string) => string | null,
): string[] {
  const problems: string[] = [];
  const names = new Set<string>();
  for (const [i, m] of mutants.entries()) {
    const label = `mutant ${i} (${m.name ?? "unnamed"})`;
    // A replacement may be empty (the text deleted); nothing else may.
    const missing = TEXT_FIELDS.filter((f) =>
      typeof m[f] !== "string" || (m[f] === "" && f !== "replace")
    );
    if (missing.length > 0) problems.push(`${label}: no ${missing.join(", ")}`);
    if (!/^[a-z0-9]+(-[a-z0-9]+)*$/.test(m.name ?? "")) {
      problems.push(`${label}: name not kebab-case`);
    }
    if (names.has(m.name)) problems.push(`${label}: a second mutant of this name`);
    names.add(m.name);
    if (m.find === m.replace) problems.push(`${label}: the replacement changes nothing`);
    const source = typeof m.file === "string" ? read(m.file) : null;
    if (source === null) problems.push(`${label}: no file ${m.file}`);
    else {
      const n = occurrences(source, m.find);
      if (n !== 1) problems.push(`${label}: its text occurs ${n} times in ${m.file}, not once`);
    }
    if (!Array.isArray(m.tests) || m.tests.length === 0) problems.push(`${label}: no tests`);
    for (const t of m.tests ?? []) {
      if (read(t) === null) problems.push(`${label}: no test file ${t}`);
    }
    if (m.filter !== undefined && typeof m.filter !== "string") problems.push(`${label}: filter`);
  }
  return problems;
}

/** `source` with `mutant` planted (its text must occur once: see {@link mutantProblems}). */
export function plant(source: string, mutant: Mutant): string {
  const at = source.indexOf(mutant.find);
  if (at < 0 || source.indexOf(mutant.find, at + 1) >= 0) {
    throw new Error(`mutant ${mutant.name}: its text is not in ${mutant.file} exactly once`);
  }
  return source.slice(0, at) + mutant.replace + source.slice(at + mutant.find.length);
}

/** Reads a file, or null when there is none. */
export function readOrNull(path: string): string | null {
  try {
    return Deno.readTextFileSync(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return null;
    throw e;
  }
}

/**
 * The mutants whose names match `patterns` (a name, or a pattern with `*`
 * for any run of characters), in list order; all when none is given.
 */
export function selectMutants(mutants: readonly Mutant[], patterns: readonly string[]): Mutant[] {
  if (patterns.length === 0) return [...mutants];
  const regexps = patterns.map((p) =>
    new RegExp(`^${p.split("*").map((s) => s.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*")}$`)
  );
  return mutants.filter((m) => regexps.some((r) => r.test(m.name)));
}
