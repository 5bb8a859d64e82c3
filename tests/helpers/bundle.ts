/** Builds the browser bundle exactly as a user does: `deno task bundle`. */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root. */
export const ROOT: string = fileURLToPath(new URL("../..", import.meta.url));

/** Runs `deno task bundle` in the repository and returns the path of `dist/halfstep.js`. */
export async function buildBundle(): Promise<string> {
  const build = await new Deno.Command(Deno.execPath(), {
    args: ["task", "bundle"],
    cwd: ROOT,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(
    build.code,
    0,
    `deno task bundle failed:\n${new TextDecoder().decode(build.stderr)}`,
  );
  return join(ROOT, "dist", "halfstep.js");
}
