/**
 * `--json` is JSON lines (issue 47, 3): with a cold tuning cache the lazy
 * tuning notice used to land on stdout (`console.info`) between the events
 * of `mnist.ts --json` and `gpt2.ts --json`, so `jq` failed on line 2. Each
 * example's `--json` run, from an empty tuning cache, is piped through a
 * JSON parser line by line here; the notices go to stderr (and the tuning
 * they announce did happen: the notice is there).
 *
 * Default pass only (.ci/run leaves it out of the Dawn pass): it runs the
 * examples as a user does, in subprocesses, whose kernels the Dawn pass
 * tests in process (and the examples on Dawn: dawn_backend_test.ts).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { GPT2, MNIST, QUICK, run, TINY_GPT, withTempDir } from "../helpers/examples.ts";
import { checkpoint, TEXT } from "../helpers/gpt2_twin.ts";
import { GPU_TEST } from "../helpers/gpu.ts";

/** Asserts that every line of `stdout` is a JSON object and the last is the `final` event. */
function assertJsonLines(stdout: string, what: string): void {
  const lines = stdout.trimEnd().split("\n");
  for (const [i, line] of lines.entries()) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(line);
    } catch {
      assert.fail(`${what}: stdout line ${i + 1} is not JSON: ${line.slice(0, 200)}`);
    }
    assert.equal(typeof parsed, "object", `${what}: line ${i + 1}`);
  }
  assert.equal(JSON.parse(lines.at(-1)!).event, "final", `${what}: ends with the final event`);
}

Deno.test({
  name: "examples: --json stdout is JSON lines only, with a cold tuning cache (mnist, tiny_gpt, " +
    "gpt2); the tuning notice is on stderr",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const weights = await checkpoint(dir), data = join(dir, "text.txt");
      await Deno.writeTextFile(data, TEXT);
      const runs: [string, string, string[]][] = [
        ["mnist", MNIST, [...QUICK, "--amp"]],
        ["tiny_gpt", TINY_GPT, ["--steps", "20", "--log-every", "10", "--eval-windows", "64"]],
        [
          "gpt2",
          GPT2,
          [
            ...["--weights", weights, "--data", data, "--context", "16", "--batch", "2"],
            ...["--steps", "2", "--eval-windows", "1", "--prompt", "The cat", "--max-new-tokens"],
            "4",
          ],
        ],
      ];
      for (const [what, script, args] of runs) {
        // A cache of its own, empty: every shape this run meets is tuned as it first runs.
        const env = { HALFSTEP_CACHE_DIR: join(dir, `cache-${what}`) };
        const r = await run(script, [...args, "--json"], true, undefined, env);
        assert.equal(r.code, 0, `${what}: ${r.stderr}`);
        assertJsonLines(r.stdout, what);
        assert.match(r.stderr, /^halfstep: tuning the kernels of this run's shapes/m, what);
      }
    });
  },
});
