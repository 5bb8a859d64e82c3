/**
 * ARCHITECTURE.md's launcher convention, checked on the source (`deno doc
 * --json` of every kernel file, and each exported function's body):
 *
 * - an exported function of a kernel folder (gpu/kernels/, amp/kernels/,
 *   optim/kernels/) that records a dispatch or calls a launcher is a launcher,
 *   named `launch…`;
 * - a launcher returns what it allocates: a declared result that is an array
 *   or a record of them, and no DeviceArray parameter named as a destination
 *   (out, into, dst, target, c, result);
 * - the few that write into their caller's arrays (an accumulation into a
 *   gradient, in-place multi-tensor updates, a slice of a bigger buffer) say
 *   so with the suffix `Into` and return nothing (`void`, or a `boolean` saying
 *   whether they wrote).
 *
 * State a launcher keeps up to date besides its results is not a destination:
 * `launchBatchNorm` returns y and the batch statistics it allocates, and
 * updates the running statistics it is given in place (PyTorch's semantics).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "../helpers/bundle.ts";

const KERNEL_FOLDERS = ["gpu/kernels", "amp/kernels", "optim/kernels"];

const DESTINATIONS = new Set(["out", "into", "dst", "target", "c", "result"]);

/** An exported function as `deno doc` and its body tell it. */
interface Exported {
  where: string;
  name: string;
  params: { name: string; type: string }[];
  returns: string | null;
  body: string;
}

interface DocType {
  repr?: string;
  kind?: string;
}
interface DocParam {
  kind: string;
  name?: string;
  left?: DocParam;
  tsType?: DocType;
}
interface DocSymbol {
  name: string;
  declarations: {
    declarationKind: string;
    kind: string;
    location: { filename: string; line: number };
    def: { params?: DocParam[]; returnType?: DocType };
  }[];
}

async function kernelFiles(): Promise<string[]> {
  const files: string[] = [];
  const walk = async (folder: string) => {
    for await (const e of Deno.readDir(join(ROOT, folder))) {
      if (e.isDirectory) await walk(`${folder}/${e.name}`);
      else if (e.name.endsWith(".ts")) files.push(join(ROOT, folder, e.name));
    }
  };
  for (const folder of KERNEL_FOLDERS) await walk(folder);
  return files.sort();
}

/** The exported functions of `files` (absolute paths). */
async function exportedFunctions(files: string[]): Promise<Exported[]> {
  const run = await new Deno.Command(Deno.execPath(), {
    args: ["doc", "--json", ...files],
    cwd: ROOT,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(run.code, 0, `deno doc failed:\n${new TextDecoder().decode(run.stderr)}`);
  const doc = JSON.parse(new TextDecoder().decode(run.stdout)) as {
    nodes: Record<string, { symbols?: DocSymbol[] }>;
  };
  const sources = new Map<string, string[]>();
  const out: Exported[] = [];
  for (const node of Object.values(doc.nodes)) {
    for (const symbol of node.symbols ?? []) {
      for (const d of symbol.declarations) {
        if (d.kind !== "function" || d.declarationKind !== "export") continue;
        const path = new URL(d.location.filename).pathname;
        if (!sources.has(path)) sources.set(path, (await Deno.readTextFile(path)).split("\n"));
        const lines = sources.get(path)!;
        // deno fmt closes a top-level function with a `}` alone on its line.
        const first = d.location.line - 1;
        let last = first;
        while (last < lines.length && lines[last] !== "}") last++;
        out.push({
          where: `${path.startsWith(ROOT) ? path.slice(ROOT.length) : path}:${d.location.line}`,
          name: symbol.name,
          params: (d.def.params ?? []).map((p) => {
            const named = p.kind === "assign" ? p.left! : p;
            return { name: named.name ?? "", type: named.tsType?.repr ?? named.tsType?.kind ?? "" };
          }),
          returns: d.def.returnType?.repr ?? d.def.returnType?.kind ?? null,
          body: lines.slice(first, last + 1).join("\n"),
        });
      }
    }
  }
  return out;
}

/** The convention's breaks among `functions`, one line each. */
function conventionBreaks(functions: Exported[]): string[] {
  const breaks: string[] = [];
  for (const f of functions) {
    const launches = /\.dispatch\(/.test(f.body) ||
      [...f.body.matchAll(/\b(launch[A-Z]\w*)\(/g)].some((m) => m[1] !== f.name);
    const launcher = f.name.startsWith("launch");
    if (launches && !launcher) {
      breaks.push(`${f.where} ${f.name} records dispatches: a launcher is named launch…`);
    }
    if (!launcher) continue;
    const writesNothingBack = f.returns === "void" || f.returns === "boolean";
    if (f.name.endsWith("Into")) {
      if (!writesNothingBack) {
        breaks.push(
          `${f.where} ${f.name} writes into its caller's arrays: it returns void (or a boolean), ` +
            `not ${f.returns}`,
        );
      }
      continue;
    }
    if (f.returns === null || writesNothingBack || f.returns === "undefined") {
      breaks.push(
        `${f.where} ${f.name} returns ${
          f.returns ?? "nothing declared"
        }: a launcher returns what ` +
          "it allocates, or writes into its caller's arrays and is named …Into",
      );
    }
    const destination = f.params.find((p) => DESTINATIONS.has(p.name) && p.type === "DeviceArray");
    if (destination) {
      breaks.push(
        `${f.where} ${f.name} takes a destination array \`${destination.name}\`: name it …Into, ` +
          "or allocate the result and return it",
      );
    }
  }
  return breaks;
}

Deno.test("launchers: each returns what it allocates, and those that write into their caller's arrays end in Into", async () => {
  const functions = await exportedFunctions(await kernelFiles());
  const launchers = functions.filter((f) => f.name.startsWith("launch"));
  assert.ok(launchers.length > 40, `the kernel folders' launchers are found (${launchers.length})`);
  assert.ok(
    launchers.some((f) => f.name === "launchMatmulInto") &&
      launchers.some((f) => f.name === "launchMatmul"),
    "matmul's two launchers are among them",
  );
  assert.deepEqual(conventionBreaks(functions), []);
});

Deno.test("launchers: the check finds a launcher that writes into its caller's array without saying so", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = join(dir, "sample_kernel.ts");
    const deviceArray = new URL(`file://${ROOT}/gpu/device/device_array.ts`).href;
    await Deno.writeTextFile(
      file,
      `import type { DeviceArray } from "${deviceArray}";
/** Writes into out. */
export function launchSum(src: DeviceArray, out: DeviceArray): void {
  src.gpu.dispatch(null!, { src, out }, {}, [1]);
}
/** Dispatches under another name. */
export function dispatchSum(src: DeviceArray): DeviceArray {
  src.gpu.dispatch(null!, { src }, {}, [1]);
  return src;
}
/** Returns an array it did not allocate, into a destination. */
export function launchCopyTo(src: DeviceArray, dst: DeviceArray): DeviceArray {
  return dst;
}
/** Fine: says so. */
export function launchSumInto(src: DeviceArray, out: DeviceArray): void {
  src.gpu.dispatch(null!, { src, out }, {}, [1]);
}
`,
    );
    const breaks = conventionBreaks(await exportedFunctions([file]));
    assert.deepEqual(breaks.map((b) => b.split(" ")[1]).sort(), [
      "dispatchSum",
      "launchCopyTo",
      "launchSum",
      "launchSum",
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
