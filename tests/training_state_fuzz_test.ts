/**
 * Fuzzing `loadTrainingState` (issue 26, finding 12): seeded mutants
 * (tests/_file_mutations.ts) of an AMP training state — AdamW, an AmpTrainer
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
import { HalfstepError } from "../mod.ts";
import { loadTrainingState, saveTrainingState } from "../files.ts";
import { decodeSafetensors } from "../nn/safetensors.ts";
import { type Mutant, mutations, splitFile, withoutChecksums } from "./_file_mutations.ts";
import { GPU_TEST } from "./_gpu.ts";
import { ampRun, type Run, snapshot, train } from "./_training_state.ts";

const MUTANTS_WITH_CHECKSUMS = 300;
const MUTANTS_WITHOUT = 300;
/** Failed loads between two checks that the state is unchanged (each check is one GPU wait). */
const BATCH = 40;
/**
 * Mutations that change the structure: they must fail even without checksums
 * (every metadata key of a training state is required, so dropping one is structural).
 */
const STRUCTURAL = new Set([
  "length-bit",
  "shape-edit",
  "json-drop-key",
  "rename",
  "truncate",
  "append",
  "metadata-drop",
]);

type State = Record<string, unknown>;

/** Keys whose values differ between two snapshots. */
function differences(a: State, b: State): string[] {
  return Object.keys(a).filter((key) => !isDeepStrictEqual(a[key], b[key]));
}

function decodes(bytes: Uint8Array): boolean {
  try {
    decodeSafetensors(bytes);
    return true;
  } catch {
    return false;
  }
}

function hasChecksums(bytes: Uint8Array): boolean {
  try {
    const metadata = splitFile(bytes).header.__metadata__ as Record<string, unknown> | undefined;
    return metadata !== undefined && Object.hasOwn(metadata, "halfstep.checksums");
  } catch {
    return false;
  }
}

/** Loads every mutant into `target`; returns the rule violations and counts by outcome. */
async function fuzz(
  dir: string,
  target: Run,
  saved: State,
  mutants: Iterable<Mutant>,
  checksums: boolean,
): Promise<{ violations: string[]; loaded: number; failed: number }> {
  const own = `${dir}/target.safetensors`;
  await saveTrainingState(own, target); // to put the target back after a load that succeeds
  const initial = await snapshot(target);
  const violations: string[] = [];
  let pending: string[] = [], loaded = 0, failed = 0;
  const checkUnchanged = async () => {
    const changed = differences(initial, await snapshot(target));
    if (changed.length > 0) {
      violations.push(`failed loads changed ${changed.join(", ")}; one of: ${pending.join("; ")}`);
    }
    pending = [];
  };
  const path = `${dir}/mutant.safetensors`;
  for (const m of mutants) {
    const what = `${m.kind} (${m.detail.slice(0, 80)})`;
    await Deno.writeFile(path, m.bytes);
    // A load that succeeds overwrites the state: check the failures before it first.
    if (pending.length > 0 && decodes(m.bytes)) await checkUnchanged();
    let extra: unknown;
    try {
      extra = await loadTrainingState(path, target);
    } catch (err) {
      failed++;
      if (m.neutral) violations.push(`${what} is harmless but failed: ${err}`);
      const message = (err as Error).message ?? "";
      if (!(err instanceof HalfstepError)) violations.push(`${what}: not a HalfstepError: ${err}`);
      else if (message.includes("\n") || message.length > 500) {
        violations.push(`${what}: not one short line (${message.length} chars): ${message}`);
      }
      pending.push(what);
      if (pending.length >= BATCH) await checkUnchanged();
      continue;
    }
    loaded++;
    const wrong = differences(saved, await snapshot(target));
    if (!isDeepStrictEqual(extra, { epoch: 3 })) wrong.push("extra");
    const mustFail = !m.neutral &&
      (checksums ? hasChecksums(m.bytes) || wrong.length > 0 : STRUCTURAL.has(m.kind));
    if (mustFail) violations.push(`${what} loaded${wrong.length ? `: ${wrong.join(", ")}` : ""}`);
    else if (checksums && wrong.length > 0) violations.push(`${what} loaded other values`);
    await loadTrainingState(own, target);
  }
  await checkUnchanged();
  return { violations, loaded, failed };
}

Deno.test({
  name: "loadTrainingState fuzz (AMP state mid-accumulation): every mutant fails with one " +
    "HalfstepError line and changes nothing, or loads exactly the saved state; no structural " +
    "change or data flip loads",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const source = ampRun(1), target = ampRun(2), expected = ampRun(3);
    try {
      train(source, 0, 5); // 2 optimizer steps and 1 of 2 micro-batches: gradients are saved
      train(target, 50, 3);
      await saveTrainingState(`${dir}/source.safetensors`, source, { extra: { epoch: 3 } });
      const file = await Deno.readFile(`${dir}/source.safetensors`);
      await loadTrainingState(`${dir}/source.safetensors`, expected);
      const saved = await snapshot(expected);
      assert.deepEqual(saved, await snapshot(source));
      const withSums = await fuzz(
        dir,
        target,
        saved,
        mutations(file, 126, MUTANTS_WITH_CHECKSUMS),
        true,
      );
      const without = await fuzz(
        dir,
        target,
        saved,
        mutations(withoutChecksums(file), 127, MUTANTS_WITHOUT),
        false,
      );
      const violations = [...withSums.violations, ...without.violations];
      assert.deepEqual(violations.slice(0, 10), [], `${violations.length} violation(s)`);
      assert.ok(withSums.failed > 0.8 * MUTANTS_WITH_CHECKSUMS, `${withSums.failed} failed`);
      assert.ok(without.loaded > 0 && without.failed > 0.5 * MUTANTS_WITHOUT);
    } finally {
      for (const run of [source, target, expected]) {
        run.trainer.dispose();
        run.optimizer.dispose();
      }
      await Deno.remove(dir, { recursive: true });
    }
  },
});
