/**
 * What the tuning cache holds, checked for its effect rather than through
 * stand-ins (issue 47, tests that can fail III): after a forced re-tune, the
 * picks a later run starts with are the new ones, and the other classes' are
 * kept; the per-user file written by two processes at once (the parallel
 * suite does it every run) keeps every entry both wrote — it used to lose
 * about half of them, each writer's read-change-rename replacing the other's.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  matmulCandidates,
  matmulSettings,
  type MatmulTiling,
  tuneMatmul,
} from "../../../gpu/mod.ts";
import { useCachedMatmulTilings } from "../../helpers/internals.ts";
import type { MatmulClass } from "../../../gpu/mod.ts";
import { withFreshTunerSettings } from "../../../gpu/tuning/settings.ts";
import { setTuningStore, type TuningStore } from "../../../gpu/tuning/store.ts";
import { ROOT } from "../../helpers/bundle.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";

/** A store in memory standing for the per-user cache (nothing else reads or writes it). */
function memoryStore(): TuningStore {
  const entries = new Map<string, string>();
  return {
    where: "memory",
    getItem: (key) => entries.get(key) ?? null,
    setItem: (key, value) => void entries.set(key, value),
    removeItem: (key) => void entries.delete(key),
    keys: () => [...entries.keys()],
  };
}

Deno.test({
  name: "tuning cache: after a forced re-tune a fresh device starts with the new pick, and the " +
    "classes it did not re-tune keep theirs",
  ...GPU_TEST,
  async fn() {
    const saved = setTuningStore(memoryStore());
    try {
      const candidates = matmulCandidates(gpu, "f32");
      const fastest = (i: number) => (c: MatmulTiling) =>
        Promise.resolve(JSON.stringify(c) === JSON.stringify(candidates[i]) ? 1e-4 : 1e-3);
      const nn: MatmulClass = { dtype: "f32", orientation: "nn", size: "medium" };
      const nt: MatmulClass = { dtype: "f32", orientation: "nt", size: "medium" };
      // What a later run (a fresh device's settings) reads from the cache at start-up.
      const startsWith = () =>
        withFreshTunerSettings(gpu, () => {
          useCachedMatmulTilings(gpu);
          const { classTilings } = matmulSettings.of(gpu);
          const name = (key: string) => JSON.stringify(classTilings.get(key));
          return Promise.resolve([name("f32/nn/medium"), name("f32/nt/medium")]);
        });
      await withFreshTunerSettings(gpu, async () => {
        await tuneMatmul(gpu, { classes: [nn, nt], timer: fastest(1), cache: true });
        assert.deepEqual(
          await startsWith(),
          [candidates[1], candidates[1]].map((c) => JSON.stringify(c)),
        );
        const [again] = await tuneMatmul(gpu, {
          classes: [nn],
          timer: fastest(2),
          cache: true,
          force: true,
        });
        assert.equal(again.cached, false, "measured again");
        assert.deepEqual(
          await startsWith(),
          [candidates[2], candidates[1]].map((c) => JSON.stringify(c)),
          "the re-tuned class's new pick, the other's kept",
        );
      });
    } finally {
      setTuningStore(saved);
    }
  },
});

/** Stores `n` entries `who.i` in the per-user store once the file `go` exists. */
const WRITER = `
import { tuningStore } from "${ROOT}/gpu/tuning/store.ts";
const [who, n, go] = Deno.args;
while (!(await Deno.stat(go).then(() => true, () => false))) {
  await new Promise((r) => setTimeout(r, 2));
}
const store = tuningStore();
for (let i = 0; i < Number(n); i++) store.setItem(who + "." + i, String(i));
`;

Deno.test("tuning cache: two processes storing into the per-user file at once keep every entry both wrote", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const script = join(dir, "writer.ts"), go = join(dir, "go"), cache = join(dir, "cache");
    await Deno.writeTextFile(script, WRITER);
    const writers = ["a", "b"].map((who) =>
      new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "--no-check",
          "--allow-read",
          "--allow-write",
          "--allow-env",
          script,
          who,
          "150",
          go,
        ],
        env: { HALFSTEP_CACHE_DIR: cache },
        stdout: "piped",
        stderr: "piped",
      }).output()
    );
    // Both started (Deno's start-up takes a while): then at once.
    await new Promise((r) => setTimeout(r, 1500));
    await Deno.writeTextFile(go, "");
    for (const out of await Promise.all(writers)) {
      assert.ok(out.success, new TextDecoder().decode(out.stderr));
    }
    const stored = JSON.parse(await Deno.readTextFile(join(cache, "tuning-0.1.0.json")));
    const expected = ["a", "b"].flatMap((w) => Array.from({ length: 150 }, (_, i) => `${w}.${i}`));
    const lost = expected.filter((k) => !(k in stored));
    assert.deepEqual(lost, [], `${lost.length} of ${expected.length} entries lost`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
