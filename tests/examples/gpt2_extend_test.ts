/**
 * A finished fine-tune can be extended (issue 47, 9): `--resume` of a
 * finished 2-step run with `--steps 4` used to be refused (`--steps 2 → 4,
 * …; Resume with the same flags`, a legend that read like one more changed
 * flag). Now a resumed run may change its length: it goes on from its step
 * into a schedule of the new total (Hugging Face's Trainer resumes into a
 * longer max_steps the same way), said in one line; below the step it has
 * reached is refused; another flag is still refused, each named with its
 * saved value.
 *
 * Default pass only (.ci/run leaves it out of the Dawn pass): it runs the
 * examples as a user does, in subprocesses, whose kernels the Dawn pass
 * tests in process (and the examples on Dawn: dawn_backend_test.ts).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { decodeSafetensors } from "../../mod.ts";
import { assertRefused, events, GPT2, run, withTempDir } from "../helpers/examples.ts";
import { checkpoint, TEXT } from "../helpers/gpt2_twin.ts";
import { GPU_TEST } from "../helpers/gpu.ts";

/** The metadata of a saved run: its record, trainer and scheduler. */
async function savedState(path: string) {
  const { metadata } = decodeSafetensors(await Deno.readFile(path));
  return {
    record: JSON.parse(metadata.extra),
    trainer: JSON.parse(metadata.trainer),
    scheduler: JSON.parse(metadata.scheduler),
  };
}

Deno.test({
  name: "gpt2.ts: a finished run resumed with a larger --steps trains on into the longer " +
    "schedule and saves; a --steps below its step and another --batch are refused in one line",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const weights = await checkpoint(dir), data = join(dir, "text.txt");
      await Deno.writeTextFile(data, TEXT);
      const path = join(dir, "run.safetensors");
      const flags = [
        ...["--weights", weights, "--data", data, "--context", "16", "--batch", "2"],
        ...["--lr", "1e-3", "--warmup", "1", "--eval-windows", "1", "--save", path],
      ];
      const first = await run(GPT2, [...flags, "--steps", "2", "--json"]);
      assert.equal(first.code, 0, first.stderr);
      assert.equal((await savedState(path)).record.step, 2);
      const longer = await run(GPT2, [...flags, "--steps", "4", "--resume", path, "--json"]);
      assert.equal(longer.code, 0, longer.stderr);
      const all = events(longer.stdout);
      assert.deepEqual(
        all.filter((e) => e.event === "extend").map(({ savedSteps, steps, step }) => [
          savedSteps,
          steps,
          step,
        ]),
        [[2, 4, 2]],
      );
      assert.deepEqual(all.filter((e) => e.event === "step").map((e) => e.step), [4]);
      assert.deepEqual(all.filter((e) => e.event === "save").map((e) => e.step), [4]);
      const state = await savedState(path);
      assert.equal(state.record.step, 4);
      assert.equal(state.trainer.steps, 4);
      assert.equal(state.scheduler.last_epoch, 4);
      // The schedule of the new total: cosine decay to lr/10 at step 4.
      assert.ok(Math.abs(state.scheduler._last_lr[0] - 1e-4) < 1e-12, state.scheduler._last_lr);
      // In text, one line says so.
      const text = await run(GPT2, [...flags, "--steps", "5", "--resume", path]);
      assert.equal(text.code, 0, text.stderr);
      assert.match(
        text.stdout,
        /^--steps 5 \(saved: 4\): extending the run from step 4; its schedule goes on as a 5-step one \(warmup, then cosine decay to lr\/10 at step 5\)$/m,
      );
      assertRefused(
        await run(GPT2, [...flags, "--steps", "3", "--resume", path]),
        /^gpt2: --steps 3: .*run\.safetensors is already at step 5; give --steps 5 \(its end\) or more \(to extend it\)\.$/,
        "below its step",
      );
      const batch = flags.map((f, i) => (flags[i - 1] === "--batch" ? "4" : f));
      assertRefused(
        await run(GPT2, [...batch, "--steps", "6", "--resume", path]),
        /^gpt2: .*run\.safetensors was saved by a run with other flags: --batch 4 \(saved: 2\)\. Resume with the saved flags \(--steps may change: it sets the run's length\)\.$/,
        "another --batch",
      );
    });
  },
});
