/**
 * The README and the guides in docs/ as the tests read them: their text,
 * the command lines of their shell blocks, and their TypeScript snippets.
 */
import { join } from "node:path";
import { ROOT } from "./_bundle.ts";

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

/**
 * Every line of the ```sh blocks of `markdown`, trimmed, comments stripped,
 * blanks dropped (```sh ignore blocks are shown, not run).
 */
export function shellLines(markdown: string): string[] {
  return [...markdown.matchAll(/```sh\n([\s\S]*?)```/g)]
    .flatMap((m) => m[1].split("\n"))
    .map((line) => line.replace(/\s+#.*$/, "").trim())
    .filter((line) => line !== "");
}

/** The ```ts blocks of `markdown` that `deno test --doc` runs (not ```ts ignore). */
export function tsSnippets(markdown: string): string[] {
  return [...markdown.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
}
