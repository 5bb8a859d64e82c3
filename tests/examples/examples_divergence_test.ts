/**
 * Divergence under AMP is caught before saving (issue 39): a run at a
 * learning rate of 1e30 used to print loss NaN, skip 48 of 50 steps at loss
 * scale 1, exit 0 and save weights of about 1e30 over the good file. Now it
 * stops with exit status 3 and one line naming --lr, whether the dynamic
 * scale reached its floor or the evaluation loss is what shows it, and the
 * good file keeps its bytes (with --overwrite too). A healthy AMP run that
 * skips a few steps runs to the end and saves.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { errorLines, events, MNIST, QUICK, run, withTempDir } from "../helpers/examples.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";

const exists = (path: string) => Deno.stat(path).then(() => true, () => false);

/** Asserts exit status 3, one line of stderr matching `message`, and no save. */
function assertDiverged(r: { code: number; stdout: string; stderr: string }, message: RegExp) {
  assert.equal(r.code, 3, r.stderr);
  const lines = errorLines(r);
  assert.equal(lines.length, 1, JSON.stringify(lines));
  assert.match(lines[0], message);
  assert.ok(!events(r.stdout).some((e) => e.event === "save"), "nothing saved");
}

Deno.test({
  name: "examples: an AMP run that diverges stops with exit 3 before saving; the good file " +
    "keeps its bytes, with --overwrite too",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const good = join(dir, "good.safetensors");
      const first = await run(MNIST, [...QUICK, "--amp", "--save", good, "--json"]);
      assert.equal(first.code, 0, first.stderr);
      const before = await Deno.readFile(good);
      // The command: 50 steps; the dynamic scale falls to its floor (1) while skipping.
      const floor = await run(MNIST, [
        ...["--limit", "6400", "--epochs", "1", "--amp", "--lr", "1e30"],
        ...["--save", good, "--overwrite", "--json"],
      ]);
      assertDiverged(
        floor,
        /^mnist: training diverged in epoch 1 \(step 50\): \d+ of 50 optimizer steps skipped \(inf\/NaN gradients at loss scale 1\): lower --lr .*; nothing was saved over .*good\.safetensors\.$/,
      );
      assert.deepEqual(await Deno.readFile(good), before, "the good file is unchanged");
      assert.ok(!(await exists(`${good}.lock`)), "the lock is released on exit 3");
      // 8 steps: the scale is still far above its floor, but the weights (~1e30) evaluate to NaN.
      const short = await run(MNIST, [
        ...[...QUICK, "--amp", "--lr", "1e30"],
        ...["--save", good, "--overwrite", "--json"],
      ]);
      assertDiverged(
        short,
        /^mnist: training diverged in epoch 1 \(step 8\): the evaluation loss is NaN: lower --lr \(or the --loss-scale\); nothing was saved over/,
      );
      assert.deepEqual(await Deno.readFile(good), before, "the good file is unchanged");
    });
  },
});

Deno.test({
  name: "examples: a healthy AMP run that skips a few steps runs to the end and saves",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const path = join(dir, "run.safetensors");
      // 2^23 is a scale at which an odd step of this run overflows f16 (2 of 25 on lavapipe).
      const args = ["--limit", "3200", "--epochs", "1", "--amp", "--loss-scale", "8388608"];
      const r = await run(MNIST, [...args, "--save", path, "--json"]);
      assert.equal(r.code, 0, r.stderr);
      const final = events(r.stdout).at(-1)!;
      const skipped = final.skippedSteps as number;
      assert.ok(skipped > 0 && skipped < 25, `a few steps skipped (${skipped}): the case to test`);
      assert.ok((final.testAccuracy as number) > 0.8, `it trained (${final.testAccuracy})`);
      assert.ok(events(r.stdout).some((e) => e.event === "save"), "saved");
    });
  },
});

Deno.test({
  name: "DivergenceWatch and evaluationHealth: +Inf and −Inf count as divergence as NaN does " +
    "(a loss, a weight, an evaluation loss)",
  ...GPU_TEST,
  async fn() {
    const { AmpTrainer, Linear, SGD, Tensor } = await import("../../mod.ts");
    const { DivergenceWatch, evaluationHealth } = await import("../../examples/cli/divergence.ts");
    const model = new Linear(3, 2, { seed: 1 });
    const trainer = new AmpTrainer(model, new SGD(model.parameters(), { lr: 0.1 }), {
      enabled: false,
    });
    const watch = await DivergenceWatch.start(trainer);
    for (const loss of [Infinity, -Infinity, NaN]) {
      const health = await watch.check(loss, null);
      assert.equal(health.diverged, `the training loss is ${loss}: lower --lr`, `loss ${loss}`);
      assert.match(evaluationHealth(loss, trainer).diverged ?? "", /the evaluation loss is/);
    }
    assert.equal((await watch.check(2.5, model.parameters())).diverged, null, "a finite run");
    for (const bad of [Infinity, -Infinity]) {
      const weights = [Tensor.from([1, 2, bad, 4], [4]), Tensor.from([0.5], [1])];
      const health = await watch.check(2.5, weights);
      assert.equal(health.diverged, "the weights hold inf or NaN: lower --lr", `weight ${bad}`);
      weights.forEach((t) => t.dispose());
    }
    assert.equal(evaluationHealth(2.5, trainer).diverged, null);
    trainer.dispose();
  },
});
