/**
 * The house rules of ARCHITECTURE.md, checked on the real module graph
 * (`deno info --json` of the entry points): imports point down the layers
 * gpu ← optim ← nn ← amp ← the entry points (mod.ts, files.ts) ← models only, no folder imports another folder's private
 * (`_`-prefixed) files, and no module imports itself back at run time.
 * Type-only imports count for the layers but not for cycles: they are erased
 * before anything runs (a Tensor's `gradFn` is typed by the tape's node, whose
 * output is typed as a Tensor).
 *
 * Inside gpu/, the wings base ← device ← tuning ← kernels ← tensor ← ops ←
 * gpu/'s own root (mod.ts, init.ts, init_options.ts), type-only imports
 * included; kernels (gpu's, amp's and optim's) never reach a tensor or an op;
 * outside gpu/, code sees gpu through its two faces; and every file link of
 * ARCHITECTURE.md resolves.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "../helpers/bundle.ts";

const LAYERS = ["gpu", "optim", "nn", "amp"] as const;

/** The models, built on the library's public face (mod.ts, files.ts), above it. */
const MODELS = "models";

/** Every library file: the top-level entry points and each .ts file of the layers and models. */
async function libraryFiles(): Promise<string[]> {
  const files = ["mod.ts", "files.ts"];
  for (const folder of [...LAYERS, MODELS]) files.push(...await filesUnder(folder));
  return files;
}

interface ModuleInfo {
  specifier: string;
  dependencies?: {
    specifier: string;
    code?: { specifier: string };
    type?: { specifier: string };
  }[];
}

/** Every .ts file under `folder` (a path from the repository's root). */
async function filesUnder(folder: string): Promise<string[]> {
  const files: string[] = [];
  for await (const e of Deno.readDir(join(ROOT, folder))) {
    if (e.isDirectory) files.push(...await filesUnder(`${folder}/${e.name}`));
    else if (e.name.endsWith(".ts")) files.push(`${folder}/${e.name}`);
  }
  return files;
}

/** The graphs, read once per run of this file. */
const graphs = new Map<string, Promise<Map<string, Set<string>>>>();

/**
 * The repository's modules and their imports by relative path: value and type
 * imports, or (`runtimeOnly`) the value imports alone. `around` adds the
 * programs and tests (examples/ and tests/) to the library.
 */
function moduleGraph(runtimeOnly = false, around = false): Promise<Map<string, Set<string>>> {
  const key = `${runtimeOnly} ${around}`;
  if (!graphs.has(key)) {
    graphs.set(
      key,
      (async () => {
        const files = await libraryFiles();
        if (around) files.push(...await filesUnder("examples"), ...await filesUnder("tests"));
        return readGraph(files, runtimeOnly);
      })(),
    );
  }
  return graphs.get(key)!;
}

async function readGraph(files: string[], runtimeOnly: boolean): Promise<Map<string, Set<string>>> {
  const root = new URL(`file://${ROOT}/`).href.replace(/\/+$/, "/");
  const graph = new Map<string, Set<string>>();
  // One module outside the repository that imports every file, so that a file no
  // entry point reaches is checked too.
  const entry = await Deno.makeTempFile({ suffix: ".ts" });
  await Deno.writeTextFile(entry, files.map((f) => `import "${root}${f}";\n`).join(""));
  try {
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
  } finally {
    await Deno.remove(entry);
  }
  assert.equal(files.filter((f) => !graph.has(f)).join(), "", "every file is read");
  return graph;
}

/** 0 for gpu … 3 for amp; 4 for the entry points at the top level; 5 for models. */
function level(path: string): number {
  const folder = path.split("/")[0];
  if (folder === MODELS) return LAYERS.length + 1;
  const i = LAYERS.indexOf(folder as typeof LAYERS[number]);
  return path.includes("/") ? i : LAYERS.length;
}

Deno.test("layering: imports point down gpu ← optim ← nn ← amp ← mod.ts ← models, never into another folder's _private files", async () => {
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

/** gpu/'s wings, lowest first; a file of gpu/'s root (mod.ts, init.ts, ...) stands above them all. */
const WINGS = ["base", "device", "tuning", "kernels", "tensor", "ops"] as const;

/** The wing of a gpu/ file (0 for base … 5 for ops, 6 for gpu/'s root), or -1 outside gpu/. */
function wing(path: string): number {
  const [folder, sub, ...rest] = path.split("/");
  if (folder !== "gpu") return -1;
  if (rest.length === 0 && sub.endsWith(".ts")) return WINGS.length;
  return WINGS.indexOf(sub as typeof WINGS[number]);
}

/** Every file `from` reaches through imports (value and type), itself excluded. */
function reach(graph: Map<string, Set<string>>, from: string): Set<string> {
  const seen = new Set<string>();
  const stack = [from];
  while (stack.length > 0) {
    for (const next of graph.get(stack.pop()!) ?? []) {
      if (!seen.has(next)) stack.push(next), seen.add(next);
    }
  }
  seen.delete(from);
  return seen;
}

Deno.test("layering: inside gpu/, imports (type-only too) point down base ← device ← tuning ← kernels ← tensor ← ops ← mod.ts/init.ts", async () => {
  const graph = await moduleGraph();
  const files = [...graph.keys()].filter((f) => f.startsWith("gpu/"));
  assert.ok(files.every((f) => wing(f) >= 0), `every gpu/ file is in a wing: ${files}`);
  const upward = files.flatMap((from) =>
    [...graph.get(from)!].filter((to) => wing(to) > wing(from)).map((to) => `${from} → ${to}`)
  );
  assert.deepEqual(upward, [], "imports from a lower wing to a higher one");
});

Deno.test("layering: kernels (gpu/kernels/, amp/kernels/, optim/kernels/) never reach a tensor or an op, and tuning/ imports only device/ and base/", async () => {
  const graph = await moduleGraph();
  const kernelFiles = [...graph.keys()].filter((f) =>
    ["gpu/kernels/", "amp/kernels/", "optim/kernels/"].some((k) => f.startsWith(k))
  );
  assert.ok(kernelFiles.length > 30, `the kernels are in the graph (${kernelFiles.length})`);
  const above = kernelFiles.flatMap((from) =>
    [...reach(graph, from)].filter((to) => /^gpu\/(tensor|ops)\//.test(to))
      .map((to) => `${from} ⇢ ${to}`)
  );
  assert.deepEqual(above, [], "kernels that reach gpu/tensor/ or gpu/ops/");
  const tuning = [...graph].filter(([f]) => f.startsWith("gpu/tuning/"));
  assert.ok(tuning.length >= 4, "the tuning wing is in the graph");
  const outside = tuning.flatMap(([from, targets]) =>
    [...targets].filter((to) => !/^gpu\/(tuning|device|base)\//.test(to))
      .map((to) => `${from} → ${to}`)
  );
  assert.deepEqual(outside, [], "tuning/ imports outside device/ and base/");
});

Deno.test("layering: gpu/device/ declares no kernel family's vocabulary (MatmulTiling, AttentionPlan, f16Accumulation)", async () => {
  const found: string[] = [];
  for await (const entry of Deno.readDir(join(ROOT, "gpu/device"))) {
    const text = await Deno.readTextFile(join(ROOT, "gpu/device", entry.name));
    for (const name of ["MatmulTiling", "AttentionPlan", "f16Accumulation"]) {
      if (new RegExp(`\\b${name}\\b`).test(text)) found.push(`${entry.name}: ${name}`);
    }
  }
  assert.deepEqual(found, []);
});

Deno.test("layering: outside gpu/, library files see gpu only through gpu/mod.ts and gpu/kernels/mod.ts, and mod.ts names no gpu file but gpu/mod.ts", async () => {
  const graph = await moduleGraph();
  const FACES = ["gpu/mod.ts", "gpu/kernels/mod.ts"];
  const behind = [...graph].flatMap(([from, targets]) =>
    from.startsWith("gpu/") ? [] : [...targets]
      .filter((to) => to.startsWith("gpu/") && !FACES.includes(to))
      .map((to) => `${from} → ${to}`)
  );
  assert.deepEqual(behind, [], "imports past gpu's faces");
  const root = [...graph.get("mod.ts")!].filter((to) => to.startsWith("gpu/"));
  assert.deepEqual(root, ["gpu/mod.ts"], "the root module's gpu imports");
});

/** The strongly connected components of more than one file (Tarjan's algorithm). */
function circles(graph: Map<string, Set<string>>): string[][] {
  const index = new Map<string, number>(), low = new Map<string, number>();
  const stack: string[] = [], onStack = new Set<string>(), found: string[][] = [];
  const visit = (v: string) => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v), onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) visit(w), low.set(v, Math.min(low.get(v)!, low.get(w)!));
      else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const component: string[] = [];
    for (let w = ""; w !== v;) w = stack.pop()!, onStack.delete(w), component.push(w);
    if (component.length > 1) found.push(component.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

Deno.test("layering: no import circle crosses folders, none outside gpu/; gpu/ holds one, type-only, of at most three files in gpu/tensor/", async () => {
  const found = circles(await moduleGraph());
  const folder = (f: string) => f.slice(0, f.lastIndexOf("/"));
  const crossing = found.filter((c) => new Set(c.map(folder)).size > 1);
  assert.deepEqual(crossing, [], "circles across folders");
  const outsideGpu = found.filter((c) => !c[0].startsWith("gpu/"));
  assert.deepEqual(outsideGpu, [], "circles outside gpu/ (type-only too)");
  const inGpu = found.filter((c) => c[0].startsWith("gpu/"));
  assert.ok(inGpu.length <= 1, `one circle in gpu/ at most: ${JSON.stringify(inGpu)}`);
  for (const c of inGpu) {
    assert.equal(folder(c[0]), "gpu/tensor", `gpu/'s circle is in gpu/tensor/: ${c}`);
    assert.ok(c.length <= 3, `gpu/tensor/'s circle has at most three files: ${c}`);
  }
  // Type-only: the run-time graph has no circle there (the cycle test above checks it whole).
  assert.deepEqual(circles(await moduleGraph(true)).filter((c) => c[0].startsWith("gpu/")), []);
});

Deno.test("layering: launchMatmulInto and the matmul tuners reach nothing above gpu/kernels/", async () => {
  const graph = await moduleGraph();
  const roots = [
    "gpu/kernels/gemm/matmul.ts",
    "gpu/kernels/gemm/class_tuner.ts",
    "gpu/kernels/gemm/shape_tuner.ts",
  ];
  for (const from of roots) {
    assert.ok(graph.has(from), `${from} is in the graph`);
    const above = [...reach(graph, from)].filter((to) => wing(to) < 0 || wing(to) > 3);
    assert.deepEqual(above, [], `${from} reaches above gpu/kernels/`);
  }
});

/** The programs: the files at examples/'s root, each a `deno run` command of the README or a guide. */
const isProgram = (f: string) => /^examples\/[^/]+\.ts$/.test(f);

/** Imports of a program's file by any other file (programs share only what folders hold). */
export function programImports(graph: Map<string, Set<string>>): string[] {
  return [...graph].flatMap(([from, targets]) =>
    [...targets].filter((to) => isProgram(to) && to !== from).map((to) => `${from} → ${to}`)
  );
}

/** The test folders that test examples/ (the programs, and the PyTorch tools of examples/torch/). */
const EXAMPLES_TESTS = ["tests/examples/", "tests/torch/"];

/**
 * The one import of examples/ from outside it, on purpose: the tests find their PyTorch the way
 * `bench host` finds its own (one finder, not two).
 */
const EXAMPLES_IMPORTED = ["tests/helpers/torch.ts → examples/cli/torch_python.ts"];

/** Imports of examples/ from outside it: the library, the models and every test but the examples'. */
export function examplesImports(graph: Map<string, Set<string>>): string[] {
  return [...graph].flatMap(([from, targets]) =>
    from.startsWith("examples/") || EXAMPLES_TESTS.some((t) => from.startsWith(t))
      ? []
      : [...targets].filter((to) => to.startsWith("examples/"))
        .map((to) => `${from} → ${to}`).filter((edge) => !EXAMPLES_IMPORTED.includes(edge))
  );
}

/** What a test may import from outside tests/: the faces, and the internals of its folder's wing. */
const TEST_FACES = [
  "mod.ts",
  "files.ts",
  "gpu/mod.ts",
  "gpu/kernels/mod.ts",
  "optim/mod.ts",
  "nn/mod.ts",
  "amp/mod.ts",
  "models/mod.ts",
];

/** The code whose internals the tests in `folder` (tests/gpu/kernels/, tests/amp/, ...) may import. */
export function wingOfTests(folder: string): string | null {
  const rest = folder.replace(/^tests\//, "");
  if (rest.startsWith("gpu/")) return rest;
  if (["optim/", "nn/", "amp/", "models/", "examples/"].includes(rest)) return rest;
  if (rest === "torch/") return "examples/";
  return null; // tests/package/: the package as a whole, through its faces
}

/** A test file's imports of internals outside its folder's wing (helpers in tests/helpers/ may import any). */
export function testWingImports(graph: Map<string, Set<string>>): string[] {
  return [...graph].flatMap(([from, targets]) => {
    if (!from.startsWith("tests/") || !from.endsWith("_test.ts")) return [];
    const wing = wingOfTests(from.slice(0, from.lastIndexOf("/") + 1));
    return [...targets].filter((to) =>
      !to.startsWith("tests/") && !TEST_FACES.includes(to) && !(wing && to.startsWith(wing))
    ).map((to) => `${from} → ${to}`);
  });
}

Deno.test("layering: examples/'s root holds only programs (each runs under import.meta.main), and no file imports a program", async () => {
  const roots: string[] = [];
  for await (const e of Deno.readDir(join(ROOT, "examples"))) {
    if (e.isFile && e.name.endsWith(".ts")) roots.push(`examples/${e.name}`);
  }
  assert.ok(roots.length >= 5, `the programs are there (${roots})`);
  const notPrograms: string[] = [];
  for (const f of roots) {
    if (!(await Deno.readTextFile(join(ROOT, f))).includes("if (import.meta.main)")) {
      notPrograms.push(f);
    }
  }
  assert.deepEqual(notPrograms, [], "files at examples/'s root that are not programs");
  assert.deepEqual(programImports(await moduleGraph(false, true)), [], "imports of a program");
});

Deno.test("layering: no import circle in examples/ (type-only imports too)", async () => {
  const inExamples = circles(await moduleGraph(false, true))
    .filter((c) => c.some((f) => f.startsWith("examples/")));
  assert.deepEqual(inExamples, []);
});

Deno.test("layering: nothing outside examples/ imports examples/ (the library, the models, the guides, the tests of other wings)", async () => {
  assert.deepEqual(examplesImports(await moduleGraph(false, true)), [], "imports of examples/");
  const guides = ["README.md", "ARCHITECTURE.md"];
  for await (const e of Deno.readDir(join(ROOT, "docs"))) {
    if (e.name.endsWith(".md")) guides.push(`docs/${e.name}`);
  }
  const inGuides = [];
  for (const g of guides) {
    const text = await Deno.readTextFile(join(ROOT, g));
    for (const m of text.matchAll(/from "([^"]*examples\/[^"]*)"/g)) inGuides.push(`${g}: ${m[1]}`);
  }
  assert.deepEqual(inGuides, [], "guides' snippets that import examples/");
});

Deno.test("layering: a test imports internals only of the wing its folder names; elsewhere the faces", async () => {
  const graph = await moduleGraph(false, true);
  const tests = [...graph.keys()].filter((f) => f.startsWith("tests/") && f.endsWith("_test.ts"));
  assert.ok(tests.length > 100, `the tests are in the graph (${tests.length})`);
  const unplaced = tests.filter((f) => f.split("/").length < 3);
  assert.deepEqual(unplaced, [], "test files outside a wing's folder");
  assert.deepEqual(testWingImports(graph), [], "imports past a wing's face");
});

Deno.test("guides: every file link of ARCHITECTURE.md, the README and docs/ resolves", async () => {
  const guides = ["ARCHITECTURE.md", "README.md"];
  for await (const e of Deno.readDir(join(ROOT, "docs"))) {
    if (e.name.endsWith(".md")) guides.push(`docs/${e.name}`);
  }
  let count = 0;
  const broken: string[] = [];
  for (const guide of guides) {
    const text = await Deno.readTextFile(join(ROOT, guide));
    const links = [...text.matchAll(/\]\(([^)#\s]+)(#[^)]*)?\)/g)].map((m) => m[1])
      .filter((link) => !/^[a-z]+:/.test(link));
    count += links.length;
    for (const link of links) {
      const path = join(ROOT, guide, "..", decodeURIComponent(link).replaceAll("\\_", "_"));
      try {
        await Deno.stat(path);
      } catch {
        broken.push(`${guide}: ${link}`);
      }
    }
  }
  assert.ok(count > 100, `the guides link their files (${count})`);
  assert.deepEqual(broken, [], "links to files that do not exist");
});
