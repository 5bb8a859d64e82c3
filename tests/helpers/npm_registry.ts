/**
 * A local npm registry for tests that watch what Deno downloads: it serves
 * each package this checkout has installed (node_modules/.deno, the one
 * version there) as npm's registry does — a packument at `/<name>` and a
 * gzipped tarball — and records every package asked for. A package it lacks
 * is a 404, and recorded too. Point Deno at it with `NPM_CONFIG_REGISTRY`
 * and an empty `DENO_DIR`: the names asked for are what a newcomer's
 * machine would fetch from npm.
 */
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const INSTALLED = fileURLToPath(new URL("../../node_modules/.deno/", import.meta.url));

/** A running registry. */
export interface NpmRegistry {
  /** Its address, with the trailing slash Deno wants. */
  url: string;
  /** The packages asked for (packument or tarball), in the order first asked. */
  asked: string[];
  /** Stops it. */
  close(): Promise<void>;
}

/** The folder and version of `name` installed in node_modules/.deno, or null. */
async function installed(name: string): Promise<{ folder: string; version: string } | null> {
  const prefix = `${name.replace("/", "+")}@`;
  for await (const entry of Deno.readDir(INSTALLED)) {
    if (!entry.isDirectory || !entry.name.startsWith(prefix)) continue;
    const version = entry.name.slice(prefix.length);
    return { folder: join(INSTALLED, entry.name, "node_modules", name), version };
  }
  return null;
}

/** `folder` as npm's tarball (its files under `package/`), gzipped. */
async function tarball(folder: string): Promise<Uint8Array> {
  const out = await new Deno.Command("tar", {
    args: ["-c", "-f", "-", "--transform", "s,^\\.,package,", "-C", folder, "."],
    stdout: "piped",
  }).output();
  if (!out.success) throw new Error(`tar of ${folder} failed`);
  const gzip = new Blob([out.stdout]).stream().pipeThrough(new CompressionStream("gzip"));
  return new Uint8Array(await new Response(gzip).arrayBuffer());
}

/** Starts a registry on a free local port. */
export function startNpmRegistry(): NpmRegistry {
  const asked: string[] = [];
  const tarballs = new Map<string, Uint8Array>();
  const ask = (name: string) => void (asked.includes(name) || asked.push(name));
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    const path = decodeURIComponent(new URL(request.url).pathname.slice(1));
    const [name, file] = path.includes("/-/") ? path.split("/-/") : [path, null];
    ask(name);
    const found = await installed(name);
    if (!found) return new Response("not found", { status: 404 });
    if (file) {
      const bytes = tarballs.get(name) ?? await tarball(found.folder);
      tarballs.set(name, bytes);
      return new Response(bytes.slice(), { headers: { "content-type": "application/gzip" } });
    }
    const manifest = JSON.parse(await Deno.readTextFile(join(found.folder, "package.json")));
    const bytes = tarballs.get(name) ?? await tarball(found.folder);
    tarballs.set(name, bytes);
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-512", bytes.slice()));
    const base = name.split("/").at(-1);
    const version = {
      ...manifest,
      name,
      version: found.version,
      dist: {
        tarball: `http://${request.headers.get("host")}/${name}/-/${base}-${found.version}.tgz`,
        integrity: `sha512-${btoa(String.fromCharCode(...digest))}`,
      },
    };
    return Response.json({
      name,
      "dist-tags": { latest: found.version },
      versions: { [found.version]: version },
    });
  });
  const { port } = server.addr as Deno.NetAddr;
  return { url: `http://127.0.0.1:${port}/`, asked, close: () => server.shutdown() };
}
