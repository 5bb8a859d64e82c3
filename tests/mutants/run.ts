/**
 * `deno task mutants`: plants each bug of tests/mutants/mutants.json, one at
 * a time, in a temporary copy of the checkout (never the working tree), runs
 * the tests the list names for it there, and says whether they caught it (a
 * test failed, or the run passed its time limit) or it survived. Not part of
 * `deno task test`: a whole run takes a while. See docs/testing.md.
 *
 * ```
 * deno task mutants                        every mutant
 * deno task mutants tiled-attention-*      those whose names match (`*`: anything)
 * deno task mutants --list                 names, files and tests, nothing run
 * deno task mutants --json                 a JSON report on stdout (progress on stderr)
 * deno task mutants --timeout 120          seconds per mutant (default 600)
 * deno task mutants --baseline             first run each mutant's tests unmutated: they must pass
 * deno task mutants --verbose              print each run's test output
 * deno task mutants --mutants scratch.json  another list (same format), to try a bug before adding it
 * ```
 *
 * Exits 0 when every mutant run was caught, 1 when one survived or its
 * tests ran nothing, 2 when the list is wrong (a text not in its file
 * exactly once, a missing test file) or a baseline fails.
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { copyCheckout } from "../helpers/checkout.ts";
import {
  loadMutants,
  type Mutant,
  mutantProblems,
  MUTANTS_FILE,
  plant,
  readOrNull,
  selectMutants,
} from "./mutants.ts";

/** How a mutant's run ended. */
type Status = "caught" | "timeout" | "survived" | "no tests";

/** One run of a mutant's tests. */
interface Outcome {
  status: Status;
  seconds: number;
  passed: number;
  failed: number;
  output: string;
}

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

const { values: options, positionals: patterns } = parseArgs({
  args: Deno.args,
  allowPositionals: true,
  options: {
    json: { type: "boolean", default: false },
    list: { type: "boolean", default: false },
    timeout: { type: "string", default: "600" },
    baseline: { type: "boolean", default: false },
    verbose: { type: "boolean", default: false },
    mutants: { type: "string" },
  },
});

/** Progress lines: stderr under --json (stdout is the report), else stdout. */
const say = (line: string) => options.json ? console.error(line) : console.log(line);

/** Runs `mutant`'s tests in `dir` (planted or not), killed after `timeout` seconds. */
async function runTests(dir: string, mutant: Mutant, cache: string): Promise<Outcome> {
  const filter = mutant.filter === undefined ? [] : ["--filter", mutant.filter];
  const started = performance.now();
  const child = new Deno.Command(Deno.execPath(), {
    // The first failure decides: a caught mutant need not run the rest.
    args: ["test", "--allow-all", "--no-check", "--fail-fast", ...filter, ...mutant.tests],
    cwd: dir,
    env: {
      DENO_WEBGPU_BACKEND: Deno.env.get("DENO_WEBGPU_BACKEND") ?? "vulkan,metal,dx12",
      // A planted tuner bug must not leave its picks in the user's tuning cache.
      HALFSTEP_CACHE_DIR: cache,
      NO_COLOR: "1",
    },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    child.kill("SIGKILL");
  }, Number(options.timeout) * 1000);
  const result = await child.output();
  clearTimeout(timer);
  const output = new TextDecoder().decode(result.stdout) + new TextDecoder().decode(result.stderr);
  const summary = /(\d+) passed \| (\d+) failed/.exec(output);
  const [passed, failed] = summary ? [Number(summary[1]), Number(summary[2])] : [0, 0];
  const status: Status = timedOut
    ? "timeout"
    : !result.success
    ? "caught"
    : passed === 0
    ? "no tests"
    : "survived";
  return { status, seconds: (performance.now() - started) / 1000, passed, failed, output };
}

/** Plants `mutant` in the copy at `dir`, runs its tests, and puts the file back. */
async function tryMutant(dir: string, mutant: Mutant, cache: string): Promise<Outcome> {
  const path = join(dir, mutant.file);
  const original = await Deno.readTextFile(path);
  await Deno.writeTextFile(path, plant(original, mutant));
  try {
    return await runTests(dir, mutant, cache);
  } finally {
    await Deno.writeTextFile(path, original);
  }
}

/** Runs each distinct test selection once unmutated; the labels of those that fail. */
async function baselineFailures(dir: string, mutants: Mutant[]): Promise<string[]> {
  const runs = new Map(mutants.map((m) => [JSON.stringify([m.tests, m.filter]), m]));
  const failures: string[] = [];
  for (const [key, m] of runs) {
    const outcome = await runTests(dir, m, join(dir, ".mutant-cache", "baseline"));
    say(`baseline ${outcome.status === "survived" ? "ok  " : "FAIL"} ${key}`);
    if (options.verbose || outcome.status !== "survived") say(outcome.output);
    if (outcome.status !== "survived") failures.push(key);
  }
  return failures;
}

async function main(): Promise<number> {
  if (!(Number(options.timeout) > 0)) {
    console.error(`--timeout wants seconds (a positive number), not ${options.timeout}`);
    return 2;
  }
  const all = await loadMutants(ROOT, options.mutants);
  const problems = mutantProblems(all, (p) => readOrNull(join(ROOT, p)));
  if (problems.length > 0) {
    console.error(`${options.mutants ?? MUTANTS_FILE} is wrong:\n  ${problems.join("\n  ")}`);
    return 2;
  }
  const chosen = selectMutants(all, patterns);
  if (chosen.length === 0) {
    console.error(`no mutant matches ${patterns.join(" ")}`);
    return 2;
  }
  if (options.list) {
    for (const m of chosen) say(`${m.name}  ${m.file}  ${m.tests.join(" ")}\n  ${m.why}`);
    return 0;
  }
  const dir = await copyCheckout("halfstep-mutants-", { nodeModules: true });
  say(`planting ${chosen.length} mutants, one at a time, in ${dir}`);
  try {
    if (options.baseline && (await baselineFailures(dir, chosen)).length > 0) {
      console.error("the tests fail without a mutant: they cannot judge one");
      return 2;
    }
    const results: (Omit<Outcome, "output"> & { name: string; file: string })[] = [];
    for (const [i, m] of chosen.entries()) {
      const { output, ...outcome } = await tryMutant(dir, m, join(dir, ".mutant-cache", m.name));
      results.push({ name: m.name, file: m.file, ...outcome });
      const counts = outcome.status === "caught" ? ` (${outcome.failed} failed)` : "";
      say(
        `[${i + 1}/${chosen.length}] ${outcome.status.toUpperCase().padEnd(8)} ` +
          `${outcome.seconds.toFixed(1).padStart(6)} s  ${m.name}${counts}`,
      );
      if (options.verbose || outcome.status === "no tests") say(output);
    }
    const caught = results.filter((r) => r.status === "caught" || r.status === "timeout");
    const missed = results.filter((r) => !caught.includes(r));
    const timeouts = caught.filter((r) => r.status === "timeout").length;
    say(
      `${results.length} mutants: ${caught.length} caught` +
        (timeouts > 0 ? ` (${timeouts} by timeout)` : "") +
        `, ${missed.length} not: ${
          missed.map((r) => `${r.name} (${r.status})`).join(", ") || "none"
        }`,
    );
    for (const r of missed) say(`  ${r.name}: ${chosen.find((m) => m.name === r.name)!.why}`);
    if (options.json) {
      console.log(JSON.stringify(
        { total: results.length, caught: caught.length, missed: missed.length, mutants: results },
        null,
        2,
      ));
    }
    return missed.length === 0 ? 0 : 1;
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.exit(await main());
