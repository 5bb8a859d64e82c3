/**
 * The benchmark runs on a bare GPU machine: the deno binary and a driver, no
 * npm packages, no network, no `deno task`. Deno installs every npm package
 * of the lock file before running a module graph that names one (a static
 * import, or a dynamic one with a literal specifier), so one data package
 * reachable from examples/bench.ts made even `--help` fail there. Run with
 * `--no-npm --no-remote`, such a graph fails at once, as it would offline.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "../helpers/bundle.ts";
import { readDocs, shellLines } from "../helpers/readme.ts";

const BENCH = join(ROOT, "examples/bench.ts");
/** The flags of the GPU command in docs/performance.md. */
const FLAGS = ["-A", "--v8-flags=--expose-gc"];

/** `deno run` as on a machine with no registry: no npm, no remote modules. */
async function offline(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-npm", "--no-remote", ...FLAGS, BENCH, ...args],
    env: { DENO_WEBGPU_BACKEND: "vulkan,metal,dx12", NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

Deno.test("bench: --help runs with no npm packages and no network", async () => {
  const r = await offline(["--help"]);
  assert.equal(r.code, 0, `exit status (stderr: ${r.stderr.slice(0, 400)})`);
  assert.match(r.stdout, /^Usage: .*bench\.ts/);
  assert.match(r.stdout, /tilings/);
});

/** The modules of `entry`'s graph from outside the checkout (node: built-ins ship inside deno). */
async function outsideModules(entry: string): Promise<{ outside: string[]; all: string[] }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", entry],
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  const graph = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    modules: { specifier: string }[];
  };
  const all = graph.modules.map((m) => m.specifier);
  return { outside: all.filter((s) => !s.startsWith("file:") && !s.startsWith("node:")), all };
}

Deno.test("gpu_check: the GPU command's module graph reaches no npm package (the models' face brings the tokenizer's; it imports the model files)", async () => {
  const { outside, all } = await outsideModules(join(ROOT, "examples/gpu_check.ts"));
  assert.deepEqual(outside, [], "modules from outside the checkout");
  assert.ok(all.some((s) => s.endsWith("/models/gpt.ts")), "the GPT is in its graph");
});

Deno.test("bench: no entry's module graph reaches an npm package or the network", async () => {
  const { outside, all } = await outsideModules(BENCH);
  assert.deepEqual(outside, [], "modules from outside the checkout");
  assert.ok(all.some((s) => s.endsWith("/examples/bench/gpt.ts")), "the graph holds every entry");
});

Deno.test("bench: matmul --size small runs with no npm packages and no network", async () => {
  const r = await offline(["matmul", "--size", "small", "--repeats", "1"]);
  assert.equal(r.code, 0, `exit status (stderr: ${r.stderr.slice(0, 400)})`);
  const rows = r.stdout.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
  const products = rows.filter((row) => row.bench === "matmul" && row.mode !== "wall time");
  // 512³, the MLP's layer, 1024³ and the GPT's three layers in three orientations, per dtype.
  assert.ok(products.length === 12 || products.length === 24, `${products.length} products`);
  for (const row of products) {
    assert.equal(row.size, "small");
    assert.ok(Number.isFinite(row.gflops) && row.gflops > 0, `${row.shape}: ${row.gflops}`);
  }
  const wall = rows.filter((row) => row.mode === "wall time");
  assert.equal(wall.length, 1, "one wall time line for the entry");
  assert.ok(wall[0].wallSeconds > 0);
});

Deno.test("bench: the GPU command the guides show is the one these tests run offline", async () => {
  const entries = "examples/bench.ts gpt ops matmul tilings --size real";
  const lines = (await readDocs()).flatMap((d) => shellLines(d.text))
    .filter((l) => l.includes("examples/bench.ts gpt ops matmul tilings"));
  assert.ok(lines.includes(`deno run ${FLAGS.join(" ")} ${entries}`), lines.join("\n"));
  // The Dawn backend's variants (docs/dawn.md, docs/tensor_cores.md) add only the backend and
  // where the output goes.
  for (const line of lines) {
    const tail = line.slice(line.indexOf("examples/bench.ts")).replace(/ > \S+$/, "");
    assert.ok(tail === entries || tail === `${entries} --backend dawn`, line);
  }
});

Deno.test("bench: gpt reports its top kernels and the tuning's picks, with no npm packages", async () => {
  const r = await offline(["gpt", "--size", "small", "--steps", "10"]);
  assert.equal(r.code, 0, `exit status (stderr: ${r.stderr.slice(0, 400)})`);
  const rows = r.stdout.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
  for (const mode of ["f32", "amp"]) {
    const row = rows.find((x) => x.bench === "gpt" && x.mode === mode);
    assert.ok(row, `a ${mode} row`);
    assert.ok(row.topKernels.some((k: { kernel: string }) => k.kernel === "matmul"), mode);
    assert.ok(row.profile.gpuMs > 0 && row.profile.wallMs > 0, `${mode}: ${row.profile}`);
  }
  const tuning = rows.find((x) => x.bench === "gpt" && x.mode === "tuning");
  // Every class the device dispatches by, and an attention plan per dtype, with its pick.
  const classes = Object.keys(tuning.matmulTilings).filter((k) => k !== "default");
  assert.deepEqual(tuning.matmul.map((p: { key: string }) => p.key).sort(), classes.sort());
  assert.deepEqual(
    tuning.attention.map((p: { key: string }) => p.key),
    tuning.f16 ? ["f32", "f16", "bf16"] : ["f32", "bf16"], // bf16 needs no shader-f16
  );
  for (const p of [...tuning.matmul, ...tuning.attention]) {
    assert.ok(p.pick && (p.cached ? p.ms === null : p.ms > 0), JSON.stringify(p));
  }
});
