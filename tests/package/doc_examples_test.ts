/**
 * Documentation examples that can fail. `deno test --doc` runs every `@example`
 * of the library and of examples/, and every ```ts block of the Markdown files
 * (the README and docs/ included), but `console.assert` only prints
 * "Assertion failed" and the example still passes. So each example must check
 * its claims with `assert`, imported from "node:assert/strict" (or throw), and
 * none may call `console.assert`.
 */
import assert from "node:assert/strict";
import { join, relative } from "node:path";
import { ROOT } from "../helpers/bundle.ts";
import { fencedBlocks } from "../helpers/readme.ts";

/** Every .ts file under these folders (`deno test --doc` runs the examples' too), and these files. */
const LIBRARY_FOLDERS = ["gpu", "optim", "nn", "amp", "examples"];
const LIBRARY_FILES = ["mod.ts", "files.ts"];
/** Folders that hold no Markdown the suite runs. */
const SKIPPED_FOLDERS = new Set([".git", "node_modules", "dist", ".gpu"]);

/** One runnable code block: where its opening fence is, and its code. */
interface CodeBlock {
  file: string;
  line: number;
  code: string;
}

/** Every file under `folder` (a path relative to the repository) whose name ends with `suffix`. */
async function* walk(folder: string, suffix: string): AsyncGenerator<string> {
  for await (const entry of Deno.readDir(join(ROOT, folder))) {
    const path = folder === "." ? entry.name : `${folder}/${entry.name}`;
    if (entry.isDirectory && !SKIPPED_FOLDERS.has(entry.name)) yield* walk(path, suffix);
    else if (entry.isFile && entry.name.endsWith(suffix)) yield path;
  }
}

/**
 * The fenced blocks of `lines` that Deno runs as TypeScript or JavaScript
 * (`ts`, `typescript`, `js`, `javascript`, `tsx`, `jsx`; not `ignore`d), each
 * line passed through `unwrap` first (JSDoc's leading ` * `).
 */
function codeBlocks(file: string, lines: string[], unwrap: (line: string) => string): CodeBlock[] {
  return fencedBlocks(lines, unwrap)
    .filter((b) => /^(ts|typescript|js|javascript|tsx|jsx)$/.test(b.lang) && !b.ignored)
    .map(({ line, code }) => ({ file, line, code }));
}

/** The code blocks inside JSDoc comments of a TypeScript file. */
function jsDocBlocks(file: string, text: string): CodeBlock[] {
  const lines = text.split("\n");
  const blocks: CodeBlock[] = [];
  let start = -1;
  lines.forEach((line, i) => {
    if (start < 0 && /^\s*\/\*\*/.test(line)) start = i;
    if (start >= 0 && line.includes("*/")) {
      const comment = lines.slice(start, i + 1);
      const unwrap = (l: string) => l.replace(/^\s*(\/\*\*|\*\/|\*(?!\/))? ?/, "");
      for (const block of codeBlocks(file, comment, unwrap)) {
        blocks.push({ ...block, line: block.line + start });
      }
      start = -1;
    }
  });
  return blocks;
}

/** Every block `deno test --doc` runs: the library's examples and the Markdown files' blocks. */
async function runnableBlocks(): Promise<CodeBlock[]> {
  const blocks: CodeBlock[] = [];
  const tsFiles = [...LIBRARY_FILES];
  for (const folder of LIBRARY_FOLDERS) {
    for await (const path of walk(folder, ".ts")) tsFiles.push(path);
  }
  for (const file of tsFiles) {
    blocks.push(...jsDocBlocks(file, await Deno.readTextFile(join(ROOT, file))));
  }
  for await (const file of walk(".", ".md")) {
    const lines = (await Deno.readTextFile(join(ROOT, file))).split("\n");
    blocks.push(...codeBlocks(file, lines, (line) => line));
  }
  return blocks;
}

/** What is wrong with `code` as an example that must be able to fail, or null. */
export function weakness(code: string): string | null {
  if (/\bconsole\.assert\s*\(/.test(code)) {
    return "uses console.assert, which prints and never fails: use assert from node:assert/strict";
  }
  const stripped = code.replace(/\bconsole\.\w+\s*\(/g, "");
  const asserts = /\bassert(\.\w+)?\s*\(/.test(stripped);
  if (!asserts && !/\bthrow\b/.test(stripped)) {
    return "asserts nothing: check its claims with assert from node:assert/strict";
  }
  if (asserts && !/^import assert from ["']node:assert\/strict["'];?$/m.test(code)) {
    return 'calls assert without import assert from "node:assert/strict"';
  }
  return null;
}

Deno.test("the block finder sees JSDoc and Markdown blocks, and skips ignored ones", () => {
  const ts = [
    "/**",
    " * @example",
    " * ```ts",
    " * console.assert(1 === 1);",
    " * ```",
    " * ```ts ignore",
    " * nothing();",
    " * ```",
    " */",
  ].join("\n");
  const found = jsDocBlocks("x.ts", ts);
  assert.deepEqual(found, [{ file: "x.ts", line: 3, code: "console.assert(1 === 1);" }]);
  const md = ["text", "```ts", "f();", "```", "```sh", "ls", "```", "```ts ignore", "g();", "```"];
  assert.deepEqual(codeBlocks("x.md", md, (l) => l), [{ file: "x.md", line: 2, code: "f();" }]);
});

Deno.test("weakness: console.assert and no assertion are refused; assert and throw pass", () => {
  assert.match(weakness("console.assert(x === 1);")!, /console\.assert/);
  assert.match(
    weakness("import assert from 'node:assert/strict';\nconsole.assert(x);")!,
    /console/,
  );
  assert.match(weakness("const x = 1;\nconsole.log(x);")!, /asserts nothing/);
  assert.equal(weakness('import assert from "node:assert/strict";\nassert.equal(f(), 2);'), null);
  assert.match(weakness("assert.throws(() => f(), ValueError);")!, /without import assert/);
  assert.match(
    weakness('import { assert } from "jsr:@std/assert";\nassert(f() === 2);')!,
    /without import assert from "node:assert\/strict"/,
  );
  assert.equal(weakness("if (f() !== 2) throw new Error('f');"), null);
});

Deno.test("every documentation example asserts for real", async () => {
  const blocks = await runnableBlocks();
  // The walk must find the examples: a broken finder would pass vacuously.
  assert.ok(blocks.length > 100, `only ${blocks.length} code blocks found`);
  const offenders = blocks.flatMap(({ file, line, code }) => {
    const why = weakness(code);
    return why === null ? [] : [`${relative(ROOT, join(ROOT, file))}:${line}: ${why}`];
  });
  assert.deepEqual(offenders, [], `examples that cannot fail:\n${offenders.join("\n")}`);
});
