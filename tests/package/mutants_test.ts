/**
 * The list of planted bugs `deno task mutants` runs (tests/mutants/) stays
 * runnable: every mutant's text is in its file exactly once, its tests
 * exist, and the list spreads over every kernel family, the tuners, AMP,
 * the optimizers and the file formats. The mutants themselves are not run
 * here (a whole run takes a while; see docs/testing.md).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  loadMutants,
  type Mutant,
  mutantProblems,
  plant,
  readOrNull,
  selectMutants,
} from "../mutants/mutants.ts";
import { ROOT } from "../helpers/bundle.ts";

/** What the list must cover, each by the files its mutants are planted in. */
const FAMILIES: Record<string, RegExp> = {
  "gemm tilings": /^gpu\/kernels\/gemm\/gemm_(register|blocked|vec4|io)\.ts$/,
  "split-K": /^gpu\/kernels\/gemm\/(gemm|matmul)\.ts$/,
  "attention row plans": /^gpu\/kernels\/attention\/flash_attention\.ts$/,
  "attention tiled plans": /^gpu\/kernels\/attention\/flash_attention_tiled\.ts$/,
  "rows": /^gpu\/kernels\/rows\//,
  "elementwise": /^gpu\/kernels\/(elementwise|wgsl\/math)\.ts$/,
  "reductions": /^gpu\/kernels\/reduce(_columns)?\.ts$/,
  "conv2d": /^gpu\/kernels\/gemm\/conv2d\.ts$/,
  "pooling": /^gpu\/kernels\/pool2d\.ts$/,
  "embedding": /^gpu\/kernels\/embedding(_grad)?\.ts$/,
  "dropout and random": /^gpu\/(kernels\/dropout|kernels\/wgsl\/random|tensor\/random)\.ts$/,
  "bf16 word layout": /^gpu\/(device\/kernel|base\/bf16)\.ts$/,
  "multi-tensor": /^gpu\/kernels\/multi_tensor\.ts$/,
  "tuners and their cache":
    /^gpu\/(tuning\/|kernels\/gemm\/(matmul_class|shape_picks)|kernels\/attention\/(tuner|settings))/,
  "AMP": /^(amp\/|gpu\/ops\/loss_scale\.ts$)/,
  "optimizers": /^optim\//,
  "file formats": /^(nn\/(safetensors|checksum)|amp\/training_state_parse)\.ts$/,
};

Deno.test("mutants: every planted bug applies (its text once in its file) and names tests that exist", async () => {
  const mutants = await loadMutants(ROOT);
  assert.deepEqual(mutantProblems(mutants, (p) => readOrNull(join(ROOT, p))), []);
  assert.ok(mutants.length >= 40, `${mutants.length} mutants`);
  for (const [family, files] of Object.entries(FAMILIES)) {
    assert.ok(mutants.some((m) => files.test(m.file)), `no mutant in ${family}`);
  }
});

const EXAMPLE: Mutant = {
  name: "example-off-by-one",
  file: "a.ts",
  find: "i < n",
  replace: "i <= n",
  tests: ["a_test.ts"],
  why: "one past the end",
};

Deno.test("mutants: the list's checks refuse what cannot be planted; plant replaces the one text", () => {
  const files: Record<string, string> = {
    "a.ts": "for (let i = 0; i < n; i++) {}",
    "twice.ts": "i < n; i < n",
    "a_test.ts": "",
  };
  const read = (p: string) => files[p] ?? null;
  assert.deepEqual(mutantProblems([EXAMPLE], read), []);
  const problems = (m: Partial<Mutant>) => mutantProblems([{ ...EXAMPLE, ...m }], read).join("\n");
  assert.match(problems({ file: "twice.ts" }), /occurs 2 times in twice\.ts, not once/);
  assert.match(problems({ find: "j < n" }), /occurs 0 times/);
  assert.match(problems({ file: "gone.ts" }), /no file gone\.ts/);
  assert.match(problems({ tests: ["gone_test.ts"] }), /no test file gone_test\.ts/);
  assert.match(problems({ tests: [] }), /no tests/);
  assert.match(problems({ replace: "i < n" }), /changes nothing/);
  assert.match(problems({ name: "Not Kebab" }), /kebab-case/);
  assert.match(problems({ why: "" }), /no why/);
  assert.match(mutantProblems([EXAMPLE, EXAMPLE], read).join("\n"), /a second mutant of this name/);
  assert.equal(plant(files["a.ts"], EXAMPLE), "for (let i = 0; i <= n; i++) {}");
  assert.throws(() => plant(files["twice.ts"], EXAMPLE), /not in a\.ts exactly once/);
});

Deno.test("mutants: names select one mutant, or several with *", () => {
  const list = ["tuner-a", "tuner-b", "scaler-a"].map((name) => ({ ...EXAMPLE, name }));
  const names = (patterns: string[]) => selectMutants(list, patterns).map((m) => m.name);
  assert.deepEqual(names([]), ["tuner-a", "tuner-b", "scaler-a"]);
  assert.deepEqual(names(["tuner-b"]), ["tuner-b"]);
  assert.deepEqual(names(["tuner-*"]), ["tuner-a", "tuner-b"]);
  assert.deepEqual(names(["*-a", "tuner-b"]), ["tuner-a", "tuner-b", "scaler-a"]);
  assert.deepEqual(names(["tuner"]), [], "a name matches whole");
});
