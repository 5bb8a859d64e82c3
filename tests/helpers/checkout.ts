/**
 * A copy of this checkout as a clone would have it: the files git tracks
 * (and untracked ones it does not ignore), nothing it ignores (no
 * node_modules, no build output). For runs that must not touch the working
 * tree (`deno task mutants`) or must start where a newcomer starts.
 */
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root. */
const ROOT = fileURLToPath(new URL("../..", import.meta.url));

/**
 * Copies the checkout's files into a new temporary folder (`prefix` names
 * it) and returns its path; with `nodeModules`, its node_modules is linked
 * there too (the copy then uses the checkout's npm packages).
 */
export async function copyCheckout(
  prefix: string,
  options: { nodeModules?: boolean } = {},
): Promise<string> {
  const listed = await new Deno.Command("git", {
    args: ["ls-files", "-z", "--cached", "--others", "--exclude-standard"],
    cwd: ROOT,
    stdout: "piped",
  }).output();
  if (!listed.success) throw new Error("git ls-files failed: is this a git checkout?");
  const files = new Set(new TextDecoder().decode(listed.stdout).split("\0").filter(Boolean));
  const dir = await Deno.makeTempDir({ prefix });
  for (const file of files) {
    const info = await Deno.lstat(join(ROOT, file)).catch(() => null);
    if (!info?.isFile) continue; // deleted in the working tree, or a link
    await Deno.mkdir(dirname(join(dir, file)), { recursive: true });
    await Deno.copyFile(join(ROOT, file), join(dir, file));
  }
  if (options.nodeModules && await Deno.lstat(join(ROOT, "node_modules")).catch(() => null)) {
    await Deno.symlink(join(ROOT, "node_modules"), join(dir, "node_modules"));
  }
  return dir;
}
