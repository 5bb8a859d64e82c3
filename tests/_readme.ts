/** The README as the tests read it: its text, and the command lines of its shell blocks. */
import { join } from "node:path";
import { ROOT } from "./_bundle.ts";

/** README.md's text. */
export function readReadme(): Promise<string> {
  return Deno.readTextFile(join(ROOT, "README.md"));
}

/** Every line of the ```sh blocks of `markdown`, trimmed, comments stripped, blanks dropped. */
export function shellLines(markdown: string): string[] {
  return [...markdown.matchAll(/```sh\n([\s\S]*?)```/g)]
    .flatMap((m) => m[1].split("\n"))
    .map((line) => line.replace(/\s+#.*$/, "").trim())
    .filter((line) => line !== "");
}
