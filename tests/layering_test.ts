/**
 * The house rules of ARCHITECTURE.md, checked on the real module graph
 * (`deno info --json` of the entry points): imports point down the layers
 * gpu ← optim ← nn ← amp only, no folder imports another folder's private
 * (`_`-prefixed) files, and no module imports itself back at run time.
 * Type-only imports count for the layers but not for cycles: they are erased
 * before anything runs (a Tensor's `gradFn` is typed by the tape's node, whose
 * output is typed as a Tensor).
 */
import assert from "node:assert/strict";
import { ROOT } from "./_bundle.ts";

const LAYERS = ["gpu", "optim", "nn", "amp"] as const;
const ENTRIES = ["mod.ts", "files.ts", ...LAYERS.map((layer) => `${layer}/mod.ts`)];

interface ModuleInfo {
  specifier: string;
  dependencies?: {
    specifier: string;
    code?: { specifier: string };
    type?: { specifier: string };
  }[];
}

/**
 * The repository's modules and their imports by relative path: value and type
 * imports, or (`runtimeOnly`) the value imports alone.
 */
async function moduleGraph(runtimeOnly = false): Promise<Map<string, Set<string>>> {
  const root = new URL(`file://${ROOT}/`).href.replace(/\/+$/, "/");
  const graph = new Map<string, Set<string>>();
  for (const entry of ENTRIES) {
    const run = await new Deno.Command(Deno.execPath(), {
      args: ["info", "--json", entry],
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(run.code, 0, new TextDecoder().decode(run.stderr));
    const info = JSON.parse(new TextDecoder().decode(run.stdout)) as { modules: ModuleInfo[] };
    for (const m of info.modules) {
      if (!m.specifier.startsWith(root)) continue;
      const from = m.specifier.slice(root.length);
      const targets = graph.get(from) ?? new Set<string>();
      for (const d of m.dependencies ?? []) {
        const kinds = runtimeOnly ? [d.code] : [d.code, d.type];
        for (const target of kinds.map((k) => k?.specifier)) {
          if (target?.startsWith(root)) targets.add(target.slice(root.length));
        }
      }
      graph.set(from, targets);
    }
  }
  return graph;
}

/** 0 for gpu … 3 for amp; 4 for the entry points at the top level. */
function level(path: string): number {
  const folder = path.split("/")[0];
  const i = LAYERS.indexOf(folder as typeof LAYERS[number]);
  return path.includes("/") ? i : LAYERS.length;
}

Deno.test("layering: imports point down gpu ← optim ← nn ← amp, never into another folder's _private files", async () => {
  const graph = await moduleGraph();
  assert.ok(graph.size > 40, `the graph holds the library (${graph.size} modules)`);
  const upward: string[] = [], privateImports: string[] = [];
  for (const [from, targets] of graph) {
    for (const to of targets) {
      if (level(to) > level(from)) upward.push(`${from} → ${to}`);
      const [folder, ...rest] = to.split("/");
      const isPrivate = rest.at(-1)?.startsWith("_") ?? false;
      if (isPrivate && !from.startsWith(`${folder}/`)) privateImports.push(`${from} → ${to}`);
    }
  }
  assert.deepEqual(upward, [], "upward imports");
  assert.deepEqual(privateImports, [], "imports of another folder's private files");
});

Deno.test("layering: the library's module graph has no import cycle at run time", async () => {
  const graph = await moduleGraph(true);
  // Depth-first search with colours; a grey node reached again closes a cycle.
  const colour = new Map<string, "grey" | "black">();
  const cycles: string[] = [];
  const visit = (node: string, path: string[]) => {
    colour.set(node, "grey");
    for (const next of graph.get(node) ?? []) {
      if (colour.get(next) === "grey") {
        cycles.push([...path.slice(path.indexOf(next)), node, next].join(" → "));
      } else if (!colour.has(next)) visit(next, [...path, node]);
    }
    colour.set(node, "black");
  };
  for (const node of graph.keys()) if (!colour.has(node)) visit(node, []);
  assert.deepEqual(cycles, []);
});
