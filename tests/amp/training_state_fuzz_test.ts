/**
 * Fuzzing `loadTrainingState` (issue 26, finding 12): seeded mutants
 * (tests/helpers/file_mutations.ts) of an AMP training state — AdamW, an AmpTrainer
 * accumulating two micro-batches, a model with biases, BatchNorm and
 * Dropout, saved mid-accumulation so gradients are in the file — each loaded
 * into a live run. Every load either fails with one short HalfstepError line
 * and leaves every piece of state (weights, buffers, gradients, working
 * copies, optimizer, learning rates, scaler, counters, the Dropout
 * generator) bit-identical, or loads exactly the saved state. With
 * checksums no mutant that changes anything loads; without them (a file
 * from an older halfstep) no structural change does, and every failure is
 * still all-or-nothing: these exercise the loader's own checks.
 */
import assert from "node:assert/strict";
import { isDeepStrictEqual } from "node:util";
import { loadTrainingState, saveTrainingState } from "../../files.ts";
import { mutations, withoutChecksums } from "../helpers/file_mutations.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { fuzzLoads, type LoadTarget, STRUCTURAL_KINDS } from "../helpers/load_fuzz.ts";
import { ampRun, type Run, snapshot, train } from "../helpers/training_state.ts";

const MUTANTS_WITH_CHECKSUMS = 300;
const MUTANTS_WITHOUT = 300;
/**
 * Every metadata key of a training state is required, so dropping one is a
 * structural change too: it must fail even without checksums.
 */
const STRUCTURAL = new Set([...STRUCTURAL_KINDS, "metadata-drop"]);

/** `run` as a fuzz target, put back after each load that succeeds from a file of its own. */
async function fuzzTarget(dir: string, run: Run): Promise<LoadTarget> {
  const own = `${dir}/target.safetensors`;
  await saveTrainingState(own, run);
  return {
    load: (path) => loadTrainingState(path, run),
    snapshot: () => snapshot(run),
    restore: async () => void await loadTrainingState(own, run),
    wrongResult: (extra) => isDeepStrictEqual(extra, { epoch: 3 }) ? [] : ["extra"],
  };
}

Deno.test({
  name: "loadTrainingState fuzz (AMP state mid-accumulation): every mutant fails with one " +
    "HalfstepError line and changes nothing, or loads exactly the saved state; no structural " +
    "change or data flip loads",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const source = ampRun(1), live = ampRun(2), expected = ampRun(3);
    try {
      train(source, 0, 5); // 2 optimizer steps and 1 of 2 micro-batches: gradients are saved
      train(live, 50, 3);
      await saveTrainingState(`${dir}/source.safetensors`, source, { extra: { epoch: 3 } });
      const file = await Deno.readFile(`${dir}/source.safetensors`);
      await loadTrainingState(`${dir}/source.safetensors`, expected);
      const saved = await snapshot(expected);
      assert.deepEqual(saved, await snapshot(source));
      const target = await fuzzTarget(dir, live);
      const withSums = await fuzzLoads(dir, target, mutations(file, 126, MUTANTS_WITH_CHECKSUMS), {
        saved,
        checksums: true,
      });
      const without = await fuzzLoads(
        dir,
        target,
        mutations(withoutChecksums(file), 127, MUTANTS_WITHOUT),
        { saved, checksums: false, structural: STRUCTURAL },
      );
      const violations = [...withSums.violations, ...without.violations];
      assert.deepEqual(violations.slice(0, 10), [], `${violations.length} violation(s)`);
      assert.ok(withSums.failed > 0.8 * MUTANTS_WITH_CHECKSUMS, `${withSums.failed} failed`);
      assert.ok(without.loaded > 0 && without.failed > 0.5 * MUTANTS_WITHOUT);
    } finally {
      for (const run of [source, live, expected]) {
        run.trainer.dispose();
        run.optimizer.dispose();
      }
      await Deno.remove(dir, { recursive: true });
    }
  },
});
