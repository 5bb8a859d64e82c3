/**
 * The tuning cache follows the user and never stops a run (issue 39). It
 * used to live in Deno's `localStorage`, which Deno keys by the main module:
 * a script saved in another folder tuned again, a corrupt store stopped
 * start-up ("file is not a database") and a read-only one too. Now the same
 * script in two folders tunes once (one per-user file, `HALFSTEP_CACHE_DIR`
 * here), and a damaged, unreadable or read-only cache — or no permission to
 * use it — starts and trains, saying so in one line.
 *
 * Each case runs a tiny script in a subprocess: one matmul class tuned (so
 * it takes seconds, not the full start-up tuning), then a few XOR steps.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { HALFSTEP_VERSION } from "../../../gpu/tuning/store.ts";
import { ROOT } from "../../helpers/bundle.ts";
import { fencedBlocks, readReadme } from "../../helpers/readme.ts";

/** Tunes one small matmul class (`dtype orientation` from the arguments), then trains XOR. */
const SCRIPT = `
import { crossEntropy, initGpu, Linear, ReLU, Sequential, SGD, Tensor, tidy } from "${ROOT}/mod.ts";
import { tuneMatmul } from "${ROOT}/gpu/mod.ts";
const [dtype, orientation] = Deno.args;
const gpu = await initGpu({ matmulTiling: "default" });
const [tuned] = await tuneMatmul(gpu, { classes: [{ dtype, orientation, size: "small" }] });
const model = new Sequential(new Linear(2, 16, { seed: 1 }), new ReLU(), new Linear(16, 2, { seed: 2 }));
const optimizer = new SGD(model.parameters(), { lr: 0.5, momentum: 0.9 });
const x = Tensor.from([0, 0, 0, 1, 1, 0, 1, 1], [4, 2]);
let loss = NaN;
for (let step = 0; step < 40; step++) {
  const l = tidy(() => crossEntropy(model.forward(x), [0, 1, 1, 0]));
  l.backward();
  optimizer.step();
  optimizer.zeroGrad();
  if (step === 39) loss = await l.item();
  l.dispose();
}
console.log(JSON.stringify({ cached: tuned.cached, loss }));
gpu.destroy();
`;

const ALL = ["--allow-read", "--allow-write", "--allow-env"];

interface Outcome {
  code: number;
  cached: boolean;
  loss: number;
  /** stderr's lines from halfstep. */
  notes: string[];
  stderr: string;
}

/** Runs the script saved at `path`, its folder the working directory. */
async function runScript(
  path: string,
  options: { env: Record<string, string>; permissions?: string[]; tune?: string[] },
): Promise<Outcome> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--no-check",
      ...(options.permissions ?? ALL),
      path,
      ...(options.tune ?? ["f32", "nn"]),
    ],
    cwd: path.slice(0, path.lastIndexOf("/")),
    env: { DENO_WEBGPU_BACKEND: "vulkan,metal,dx12", NO_COLOR: "1", ...options.env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(out.stdout),
    stderr = new TextDecoder().decode(out.stderr);
  const line = stdout.trim().split("\n").at(-1) ?? "";
  const result = line.startsWith("{") ? JSON.parse(line) : { cached: false, loss: NaN };
  const notes = stderr.split("\n").filter((l) => l.startsWith("halfstep:"));
  return { code: out.code, ...result, notes, stderr };
}

/** Asserts a run that started, trained and said `note` (one line). */
function assertTrained(r: Outcome, note: RegExp, what: string): void {
  assert.equal(r.code, 0, `${what}: ${r.stderr}`);
  assert.ok(r.loss < 0.1, `${what}: it trained (loss ${r.loss})`);
  assert.equal(r.notes.length, 1, `${what}: one line, got ${JSON.stringify(r.notes)}`);
  assert.match(r.notes[0], note, what);
}

/** The script saved as `name` in a fresh folder of `dir`. */
async function scriptIn(dir: string, folder: string, name: string): Promise<string> {
  await Deno.mkdir(join(dir, folder), { recursive: true });
  const path = join(dir, folder, name);
  await Deno.writeTextFile(path, SCRIPT);
  return path;
}

/**
 * Makes `dir` read-only for `fn`: by its mode where that binds (not root),
 * else (root ignores modes) as a read-only tmpfs holding the same files.
 */
async function readOnly(dir: string, fn: () => Promise<void>): Promise<void> {
  if (!runsAsRoot()) {
    await Deno.chmod(dir, 0o555);
    try {
      return await fn();
    } finally {
      await Deno.chmod(dir, 0o755);
    }
  }
  const saved = new Map<string, Uint8Array>();
  for await (const e of Deno.readDir(dir)) {
    saved.set(e.name, await Deno.readFile(join(dir, e.name)));
  }
  const mount = (...args: string[]) => new Deno.Command("mount", { args }).outputSync();
  assert.ok(mount("-t", "tmpfs", "tmpfs", dir).success, "mount a tmpfs (needs CAP_SYS_ADMIN)");
  try {
    for (const [name, bytes] of saved) await Deno.writeFile(join(dir, name), bytes);
    assert.ok(mount("-o", "remount,ro", dir).success, "remount it read-only");
    await fn();
  } finally {
    new Deno.Command("umount", { args: [dir] }).outputSync();
  }
}

/** Whether this process runs as root (asked of `id`: the suite runs without --allow-sys). */
function runsAsRoot(): boolean {
  const out = new Deno.Command("id", { args: ["-u"] }).outputSync();
  return new TextDecoder().decode(out.stdout).trim() === "0";
}

/** Whether this process can make a folder read-only (a mode as a user; a mount as root). */
const CAN_MAKE_READ_ONLY = !runsAsRoot() ||
  (() => {
    try {
      const probe = Deno.makeTempDirSync();
      const ok = new Deno.Command("mount", { args: ["-t", "tmpfs", "tmpfs", probe] }).outputSync();
      if (ok.success) new Deno.Command("umount", { args: [probe] }).outputSync();
      Deno.removeSync(probe);
      return ok.success;
    } catch {
      return false;
    }
  })();

Deno.test("tuning cache: the same script in two folders tunes once (a per-user file)", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const env = { HALFSTEP_CACHE_DIR: join(dir, "cache") };
    const first = await runScript(await scriptIn(dir, "one", "tiny.ts"), { env });
    assert.equal(first.code, 0, first.stderr);
    assert.equal(first.cached, false, "the first run tunes");
    assert.deepEqual(first.notes, [], "nothing to say");
    const file = join(dir, "cache", `tuning-${HALFSTEP_VERSION}.json`);
    const stored = JSON.parse(await Deno.readTextFile(file));
    assert.ok(Object.keys(stored).some((k) => k.startsWith("halfstep.matmulTuning.")), "stored");
    // Another folder, another name: Deno's localStorage would be another store.
    const second = await runScript(await scriptIn(dir, "elsewhere/deeper", "copy.ts"), { env });
    assert.equal(second.code, 0, second.stderr);
    assert.equal(second.cached, true, "the copy in another folder reuses the winner");
    assert.deepEqual(second.notes, []);
    // XDG_CACHE_HOME places it too (HALFSTEP_CACHE_DIR unset).
    const xdg = await runScript(await scriptIn(dir, "three", "t.ts"), {
      env: { XDG_CACHE_HOME: join(dir, "xdg") },
    });
    assert.equal(xdg.code, 0, xdg.stderr);
    await Deno.stat(join(dir, "xdg", "halfstep", `tuning-${HALFSTEP_VERSION}.json`));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("tuning cache: a damaged or unreadable cache file starts and trains, with one line, and is left alone", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const cache = join(dir, "cache"), file = join(cache, `tuning-${HALFSTEP_VERSION}.json`);
    await Deno.mkdir(cache);
    const script = await scriptIn(dir, "s", "tiny.ts");
    const env = { HALFSTEP_CACHE_DIR: cache };
    await Deno.writeTextFile(file, "{not json");
    const damaged = await runScript(script, { env });
    assertTrained(
      damaged,
      /^halfstep: the tuning cache .*tuning-.*\.json is damaged .*tuning in memory/,
      "damaged",
    );
    assert.equal(await Deno.readTextFile(file), "{not json", "left as it was");
    await Deno.remove(file);
    await Deno.mkdir(file); // a folder where the file should be: reading it fails
    const unreadable = await runScript(script, { env });
    assertTrained(
      unreadable,
      /^halfstep: cannot read the tuning cache .*; tuning in memory/,
      "unreadable",
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name:
    "tuning cache: a read-only cache is read, and a run that must tune more trains, with one line" +
    (CAN_MAKE_READ_ONLY ? "" : " (IGNORED: this process can make no folder read-only)"),
  ignore: !CAN_MAKE_READ_ONLY,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      const cache = join(dir, "cache");
      const script = await scriptIn(dir, "s", "tiny.ts");
      const env = { HALFSTEP_CACHE_DIR: cache };
      assert.equal((await runScript(script, { env })).code, 0);
      await readOnly(cache, async () => {
        const known = await runScript(script, { env });
        assert.equal(known.code, 0, known.stderr);
        assert.equal(known.cached, true, "read from the read-only cache");
        assert.deepEqual(known.notes, [], "nothing written, nothing to say");
        const more = await runScript(script, { env, tune: ["f32", "tn"] });
        assertTrained(
          more,
          /^halfstep: cannot write the tuning cache .*; tuning results kept in memory$/,
          "read-only",
        );
      });
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("tuning cache: without permission to use it (and with a damaged localStorage) a script starts and trains, with one line", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const script = await scriptIn(dir, "s", "tiny.ts");
    const env = { HALFSTEP_CACHE_DIR: join(dir, "cache"), DENO_DIR: join(dir, "deno") };
    const readOnlyFlags = [`--allow-read`, "--allow-env"];
    const first = await runScript(script, { env, permissions: readOnlyFlags });
    assertTrained(
      first,
      /^halfstep: --allow-read and --allow-write for the per-user tuning cache .* would share tuning results between scripts; kept for this script only \(localStorage\)$/,
      "no --allow-write",
    );
    // Deno's localStorage of this script, damaged: the store Deno opens is not a database.
    const stores = join(dir, "deno", "location_data");
    for await (const origin of Deno.readDir(stores)) {
      for await (const f of Deno.readDir(join(stores, origin.name))) {
        await Deno.writeTextFile(join(stores, origin.name, f.name), "not a database".repeat(100));
      }
    }
    // It used to stop with "file is not a database" after tuning.
    const damaged = await runScript(script, {
      env,
      permissions: readOnlyFlags,
      tune: ["f32", "tn"],
    });
    assertTrained(
      damaged,
      /^halfstep: cannot store tuning results in localStorage \(.*\); kept in memory$/,
      "a damaged localStorage",
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("tuning cache: its file is named by halfstep's version, deno.json's", async () => {
  const config = JSON.parse(await Deno.readTextFile(join(ROOT, "deno.json")));
  assert.equal(HALFSTEP_VERSION, config.version, "bump HALFSTEP_VERSION with deno.json's version");
});

/**
 * Runs with initGpu()'s defaults (lazy tuning) one f32 product worth tuning
 * (96 × 128 by 128 × 80) and reads it: the wait tunes its class.
 */
const LAZY_SCRIPT = `
import { initGpu, matmul, Tensor } from "${ROOT}/mod.ts";
import { lazyTuning, matmulSettings } from "${ROOT}/gpu/mod.ts";
const gpu = await initGpu();
const cachedAtStart = matmulSettings.of(gpu).classTilings.size;
const c = matmul(Tensor.full([96, 128], 0.5), Tensor.full([128, 80], 0.25));
const value = (await c.read())[0];
const tuned = lazyTuning.of(gpu).finished.size;
console.log(JSON.stringify({ cachedAtStart, tuned, value }));
gpu.destroy();
`;

/** Runs `source` saved as `folder/name` in `dir`, from its folder; stdout's lines and the result. */
async function runSaved(
  dir: string,
  folder: string,
  name: string,
  source: string,
  env: Record<string, string>,
  permissions: string[] = ALL,
): Promise<{ code: number; lines: string[]; stderr: string }> {
  await Deno.mkdir(join(dir, folder), { recursive: true });
  const path = join(dir, folder, name);
  await Deno.writeTextFile(path, source);
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-check", ...permissions, path],
    cwd: join(dir, folder),
    env: { DENO_WEBGPU_BACKEND: "vulkan,metal,dx12", NO_COLOR: "1", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, lines: text(out.stdout).trim().split("\n"), stderr: text(out.stderr) };
}

Deno.test("tuning cache: initGpu() tunes a product at the wait after it first runs, once: a copy in another folder finds the pick at start-up", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const env = { HALFSTEP_CACHE_DIR: join(dir, "cache") };
    const first = await runSaved(dir, "one", "lazy.ts", LAZY_SCRIPT, env);
    assert.equal(first.code, 0, first.stderr);
    // On stderr (stdout stays the script's), one line: that it tunes, and where the picks go.
    assert.deepEqual(first.lines.filter((l) => l.startsWith("halfstep:")), [], "not on stdout");
    const said = first.stderr.split("\n").filter((l) => l.startsWith("halfstep:"));
    assert.equal(said.length, 1, `one line says it tunes: ${first.stderr}`);
    assert.match(
      said[0],
      /tuning the kernels of this run's shapes as they first run, .*; tuning results are kept in .*cache\/tuning-.*\.json; every later script starts with them\)/,
    );
    const cold = JSON.parse(first.lines.at(-1)!);
    assert.deepEqual([cold.cachedAtStart, cold.tuned], [0, 1], "nothing cached; one class tuned");
    assert.equal(cold.value, 128 * 0.5 * 0.25, "the product before the tuning is right");
    const second = await runSaved(dir, "elsewhere/deeper", "copy.ts", LAZY_SCRIPT, env);
    assert.equal(second.code, 0, second.stderr);
    assert.deepEqual(second.lines.filter((l) => l.startsWith("halfstep:")), [], "nothing to say");
    assert.doesNotMatch(second.stderr, /^halfstep:/m, "nothing to say on stderr either");
    const warm = JSON.parse(second.lines.at(-1)!);
    assert.ok(warm.cachedAtStart >= 1, "the pick is there before the first product");
    assert.equal(warm.tuned, 0, "nothing measured again");
    assert.equal(warm.value, cold.value);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("tuning cache: where the picks are kept is one true line when tuning starts, on stderr, whatever the cache folder is (no --allow-write, a file, damaged, read-only)", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const cache = join(dir, "cache");
    const readOnlyCase = CAN_MAKE_READ_ONLY ? [["read-only", "read-only"]] : [];
    const cases: [string, RegExp, () => Promise<void>, string[]?][] = [
      [
        "no --allow-write (the demo's permissions)",
        /--allow-read and --allow-write for the per-user tuning cache .* would share tuning results between scripts; kept for this script only \(localStorage\)\)\. /,
        async () => {},
        ["--allow-read", "--allow-env"],
      ],
      [
        "a file where the folder should be",
        /cannot read the tuning cache .*tuning-.*\.json \(Not a directory.*\); tuning in memory this run\)\. /,
        () => Deno.writeTextFile(cache, "a file"),
      ],
      [
        "a damaged cache file",
        /the tuning cache .*tuning-.*\.json is damaged \(not a JSON object\); tuning in memory this run/,
        async () => {
          await Deno.mkdir(cache);
          await Deno.writeTextFile(join(cache, `tuning-${HALFSTEP_VERSION}.json`), "{not json");
        },
      ],
    ];
    for (const [what, line, prepare, permissions] of cases) {
      await Deno.remove(cache, { recursive: true }).catch(() => {});
      await prepare();
      // A localStorage of its own too: an earlier case's picks there would be found.
      const env = { HALFSTEP_CACHE_DIR: cache, DENO_DIR: join(dir, `deno-${what.length}`) };
      const r = await runSaved(dir, "s", "lazy.ts", LAZY_SCRIPT, env, permissions);
      assert.equal(r.code, 0, `${what}: ${r.stderr}`);
      assert.equal(JSON.parse(r.lines.at(-1)!).tuned, 1, `${what}: it tuned`);
      assert.deepEqual(r.lines.filter((l) => /halfstep|cache/.test(l)), [r.lines.at(-1)], what);
      const said = r.stderr.split("\n").filter((l) => l.startsWith("halfstep:"));
      assert.equal(said.length, 1, `${what}: one line, got ${JSON.stringify(said)}`);
      assert.match(said[0], /^halfstep: tuning the kernels of this run's shapes/, what);
      assert.match(said[0], line, what);
    }
    for (const [what] of readOnlyCase) {
      await Deno.remove(cache, { recursive: true }).catch(() => {});
      await Deno.mkdir(cache);
      await readOnly(cache, async () => {
        const r = await runSaved(dir, "s", "lazy.ts", LAZY_SCRIPT, { HALFSTEP_CACHE_DIR: cache });
        assert.equal(r.code, 0, `${what}: ${r.stderr}`);
        const said = r.stderr.split("\n").filter((l) => l.startsWith("halfstep:"));
        assert.equal(said.length, 1, `${what}: one line, got ${JSON.stringify(said)}`);
        assert.match(said[0], /cannot write the tuning cache .*; tuning results kept in memory/);
      });
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("tuning cache: the README's first model starts and trains measuring nothing: no line, no cache file", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const [first] = fencedBlocks((await readReadme()).split("\n"))
      .filter((b) => b.lang === "ts").map((b) => b.code);
    assert.match(first, /initGpu\(\)/, "the README's first snippet starts with initGpu's defaults");
    const source = first.replaceAll('"@halfstep/halfstep"', `"${ROOT}/mod.ts"`);
    const cache = join(dir, "cache");
    const r = await runSaved(dir, "s", "first.ts", source, { HALFSTEP_CACHE_DIR: cache });
    assert.equal(r.code, 0, r.stderr);
    assert.ok(r.lines.some((l) => /^loss 0\.0\d+ on /.test(l)), `it trained: ${r.lines}`);
    assert.deepEqual(r.lines.filter((l) => l.startsWith("halfstep:")), [], "no tuning line");
    await assert.rejects(Deno.stat(cache), Deno.errors.NotFound, "nothing measured, nothing kept");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
