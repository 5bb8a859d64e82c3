/**
 * A static file server for the repository, so that a browser can open the
 * web demo (`examples/web/index.html`) and load the bundle from `dist/`.
 * Also used by the tests that import halfstep over HTTP.
 *
 * Run it with `deno task web`, which builds the bundle first.
 *
 * @module
 */
import { extname, join, normalize, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".ts": "application/typescript; charset=utf-8",
  ".map": "application/json; charset=utf-8",
  ".json": "application/json; charset=utf-8",
  ".css": "text/css; charset=utf-8",
};

/** Options of {@link serveDirectory}. */
export interface ServeOptions {
  /** Port to listen on; 0 (the default) picks a free one. */
  port?: number;
  /** Address to listen on (default 127.0.0.1: never exposed beyond this machine). */
  hostname?: string;
}

/**
 * Serves the files under `root` over HTTP. Paths that would leave `root` are
 * refused; missing files are 404; a folder without its trailing slash is
 * redirected to it (relative links then resolve inside the folder); `.ts`
 * files go out as `application/typescript`, which Deno needs to import them. Shut it down with `server.shutdown()`.
 *
 * @param root the directory to serve
 * @param options port and address
 * @returns the running server (its `addr.port` is the port in use)
 */
export function serveDirectory(
  root: string,
  options: ServeOptions = {},
): Deno.HttpServer<Deno.NetAddr> {
  const base = normalize(root.endsWith(sep) ? root : root + sep);
  return Deno.serve(
    { hostname: options.hostname ?? "127.0.0.1", port: options.port ?? 0, onListen() {} },
    async (request) => {
      const url = new URL(request.url);
      let path = normalize(join(base, decodeURIComponent(url.pathname)));
      if (!path.startsWith(base)) return new Response("forbidden", { status: 403 });
      try {
        if ((await Deno.stat(path)).isDirectory) {
          // A page's relative imports resolve against its URL: `/examples/web`
          // would load `/examples/spirals.js`, so send it to `/examples/web/`.
          if (!url.pathname.endsWith("/")) {
            return Response.redirect(new URL(`${url.pathname}/${url.search}`, url), 301);
          }
          path = join(path, "index.html");
        }
        const type = CONTENT_TYPES[extname(path)] ?? "application/octet-stream";
        return new Response(await Deno.readFile(path), { headers: { "content-type": type } });
      } catch {
        return new Response("not found", { status: 404 });
      }
    },
  );
}

if (import.meta.main) {
  const { values } = parseArgs({ args: Deno.args, options: { port: { type: "string" } } });
  const root = fileURLToPath(new URL("../..", import.meta.url));
  const server = serveDirectory(root, { port: Number(values.port ?? 8000) });
  const base = `http://127.0.0.1:${server.addr.port}`;
  console.log(`serving this checkout on ${base}/ (Ctrl-C stops)`);
  console.log(`  import by URL: ${base}/mod.ts`);
  try {
    await Deno.stat(join(root, "dist", "halfstep.js"));
    console.log(`  web demo:      ${base}/examples/web/`);
  } catch {
    // mod.ts needs no bundle; only the web demo does.
    console.log("  web demo:      dist/halfstep.js is missing: run `deno task web` instead");
  }
}
