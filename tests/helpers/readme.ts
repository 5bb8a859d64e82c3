/**
 * The README and the guides in docs/ as the tests read them: their text,
 * the command lines of their shell blocks, and their TypeScript snippets.
 */
import { join } from "node:path";
import { ROOT } from "./bundle.ts";

/** README.md's text. */
export function readReadme(): Promise<string> {
  return Deno.readTextFile(join(ROOT, "README.md"));
}

/** One Markdown document: its path from the checkout's root and its text. */
export interface Doc {
  path: string;
  text: string;
}

/** README.md, then every docs/*.md by name. */
export async function readDocs(): Promise<Doc[]> {
  const names: string[] = [];
  for await (const e of Deno.readDir(join(ROOT, "docs"))) {
    if (e.isFile && e.name.endsWith(".md")) names.push(`docs/${e.name}`);
  }
  const paths = ["README.md", ...names.sort()];
  return await Promise.all(
    paths.map(async (path) => ({ path, text: await Deno.readTextFile(join(ROOT, path)) })),
  );
}

/** docs/`name`'s text. */
export function readDoc(name: string): Promise<string> {
  return Deno.readTextFile(join(ROOT, "docs", name));
}

/** One fenced code block: where its opening fence is (1-based), its language, and its code. */
export interface FencedBlock {
  line: number;
  /** The info string's first word (`ts`, `sh`, ...; "" for none). */
  lang: string;
  /** Whether the info string says `ignore` (shown, not run). */
  ignored: boolean;
  code: string;
}

/**
 * The fenced code blocks of `lines` (Markdown's, or a JSDoc comment's with
 * `unwrap` taking off each line's leading ` * `): the one fence parser of
 * the tests that read documentation.
 */
export function fencedBlocks(
  lines: readonly string[],
  unwrap: (line: string) => string = (line) => line,
): FencedBlock[] {
  const blocks: FencedBlock[] = [];
  let open: { line: number; lang: string; ignored: boolean; code: string[] } | null = null;
  lines.forEach((raw, i) => {
    const line = unwrap(raw);
    const fence = line.match(/^\s*```\s*(\S*)(.*)$/);
    if (open === null) {
      if (fence !== null) {
        open = { line: i + 1, lang: fence[1], ignored: /\bignore\b/.test(fence[2]), code: [] };
      }
    } else if (fence !== null && fence[1] === "") {
      blocks.push({ ...open, code: open.code.join("\n") });
      open = null;
    } else {
      open.code.push(line);
    }
  });
  return blocks;
}

/**
 * Every line of the ```sh blocks of `markdown`, trimmed, comments stripped,
 * blanks dropped (```sh ignore blocks are shown, not run).
 */
export function shellLines(markdown: string): string[] {
  return fencedBlocks(markdown.split("\n"))
    .filter((b) => b.lang === "sh" && !b.ignored)
    .flatMap((b) => b.code.split("\n"))
    .map((line) => line.replace(/\s+#.*$/, "").trim())
    .filter((line) => line !== "");
}
