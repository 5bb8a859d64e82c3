/**
 * The examples' guards on their own, without training: when a run counts as
 * diverged or earns a warning (the loss, the weights, the skipped steps and
 * the loss scale), the `--save` lock (a live owner refused, a file left by a
 * killed run taken over, released once), and the resume flag check.
 *
 * Default pass only (.ci/run leaves it out of the Dawn pass): it runs the
 * examples as a user does, in subprocesses, whose kernels the Dawn pass
 * tests in process (and the examples on Dawn: dawn_backend_test.ts).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Adam, AmpTrainer, crossEntropy, Tensor } from "../../mod.ts";
import { UsageError } from "../../examples/cli/flags.ts";
import { DivergenceWatch, SKIPPED_STREAK } from "../../examples/cli/divergence.ts";
import { loadData } from "../../examples/data/mnist_batches.ts";
import { MNIST_PIXELS } from "../../examples/data/mnist.ts";
import { mnistMlp } from "../../examples/mnist/model.ts";
import { checkResumeFlags } from "../../examples/cli/resume_flags.ts";
import { SaveLock } from "../../examples/runs/save_lock.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { withTempDir } from "../helpers/examples.ts";

/** A trainer as the watch sees it: its step count and its scaler's counters. */
function fakeTrainer(amp: boolean, lossScale = 0) {
  const fake = {
    steps: 0,
    skipped: 0,
    scale: 65536,
    scaler: {
      enabled: amp,
      skippedSteps: () => Promise.resolve(fake.skipped),
      stateDict: () =>
        Promise.resolve({
          scale: fake.scale,
          skippedSteps: fake.skipped,
          options: { lossScale, minScale: 1 },
        }),
    },
  };
  return fake;
}

/** Runs `steps` optimizer steps of which `skipped` were skipped, then checks `loss`. */
async function after(
  watch: DivergenceWatch,
  fake: ReturnType<typeof fakeTrainer>,
  steps: number,
  skipped: number,
  loss: number,
) {
  fake.steps += steps;
  fake.skipped += skipped;
  return await watch.check(loss, null);
}

Deno.test("examples guards: f32 diverges on a non-finite loss; AMP on all steps skipped at a floor", async () => {
  const f32 = fakeTrainer(false);
  const plain = await DivergenceWatch.start(f32 as unknown as AmpTrainer);
  assert.deepEqual(await after(plain, f32, 8, 0, 0.5), { diverged: null, warning: null });
  assert.match((await after(plain, f32, 8, 0, NaN)).diverged!, /loss is NaN: lower --lr/);
  assert.match((await after(plain, f32, 8, 0, Infinity)).diverged!, /loss is Infinity/);

  const dynamic = fakeTrainer(true);
  const amp = await DivergenceWatch.start(dynamic as unknown as AmpTrainer);
  // A NaN batch under AMP is skipped on purpose: not divergence.
  assert.deepEqual(await after(amp, dynamic, 8, 1, NaN), { diverged: null, warning: null });
  // Most steps skipped while the scale can still fall: a warning.
  const most = await after(amp, dynamic, 8, 8, 2.3);
  assert.equal(most.diverged, null);
  assert.match(
    most.warning!,
    /^8 of 8 optimizer steps skipped .* at loss scale 65536\); check --lr/,
  );
  // Every step skipped with the scale at its floor: diverged.
  dynamic.scale = 1;
  const floor = await after(amp, dynamic, 8, 8, 2.3);
  assert.match(floor.diverged!, /8 of 8 .* loss scale 1\): lower --lr/);

  const fixed = fakeTrainer(true, 16777216);
  fixed.scale = 16777216;
  const staticWatch = await DivergenceWatch.start(fixed as unknown as AmpTrainer);
  const warned = await after(staticWatch, fixed, 8, 5, 2.3);
  assert.match(warned.warning!, /5 of 8 .* lower --loss-scale 16777216 \(0 is dynamic scaling\)/);
  const all = await after(staticWatch, fixed, 8, 8, 2.3);
  assert.match(all.diverged!, /8 of 8 optimizer steps skipped .*lower --loss-scale 16777216/);
});

Deno.test("examples guards: under AMP, skips with the dynamic scale at its floor, or a long streak of them, are divergence", async () => {
  // The run (--amp --lr 1e30): 2 steps went through, then 48 skipped down to scale 1.
  const fell = fakeTrainer(true);
  const watch = await DivergenceWatch.start(fell as unknown as AmpTrainer);
  fell.scale = 1;
  const floor = await after(watch, fell, 50, 48, NaN);
  assert.match(
    floor.diverged!,
    /^48 of 50 optimizer steps skipped \(inf\/NaN gradients at loss scale 1\): lower --lr \(the dynamic scale is at its floor\)$/,
  );
  // Every step skipped for SKIPPED_STREAK steps, counted across checks, whatever the scale.
  const stuck = fakeTrainer(true);
  const streak = await DivergenceWatch.start(stuck as unknown as AmpTrainer);
  for (let done = 10; done < SKIPPED_STREAK; done += 10) {
    assert.equal((await after(streak, stuck, 10, 10, 2.3)).diverged, null, `${done} in a row`);
  }
  assert.match((await after(streak, stuck, 10, 10, 2.3)).diverged!, /10 of 10 .* lower --lr$/);
  // A clean step breaks the streak.
  const mixed = fakeTrainer(true);
  const broken = await DivergenceWatch.start(mixed as unknown as AmpTrainer);
  for (let i = 0; i < 2 * SKIPPED_STREAK / 10; i++) {
    const health = await after(broken, mixed, 10, i % 4 === 3 ? 9 : 10, 2.3);
    assert.equal(health.diverged, null, `check ${i}`);
  }
});

Deno.test({
  name: "examples guards: a healthy AMP run whose first steps overflow (scale backing off from " +
    "2^24) and that skips now and then is never stopped",
  ...GPU_TEST,
  async fn() {
    const { train } = await loadData({ limit: 2048 });
    const model = mnistMlp(3);
    const trainer = new AmpTrainer(model, new Adam(model.parameters(), { lr: 2e-3 }), {
      scaler: { initScale: 2 ** 24, growthInterval: 10 },
    });
    const watch = await DivergenceWatch.start(trainer);
    const x = new Float32Array(128 * MNIST_PIXELS);
    const labels = new Int32Array(128);
    let loss = 0;
    for (let step = 0; step < 48; step++) {
      const at = (step % 16) * 128;
      x.set(train.images.subarray(at * MNIST_PIXELS, (at + 128) * MNIST_PIXELS));
      labels.set(train.labels.subarray(at, at + 128));
      const l = trainer.step(() => crossEntropy(model.forward(Tensor.from(x, [128, 784])), labels));
      if (step % 4 === 3) loss = await l.item(); // checked every 4 steps, as with --log-every 4
      l.dispose();
      if (step % 4 === 3) {
        const health = await watch.check(loss, model.parameters());
        assert.equal(health.diverged, null, `step ${step}: ${health.diverged}`);
      }
    }
    const skipped = await trainer.scaler.skippedSteps();
    assert.ok(skipped > 0 && skipped < 48, `some steps skipped (${skipped}): the case to test`);
    assert.ok(Number.isFinite(loss) && loss < 1, `it trained (loss ${loss})`);
    trainer.dispose();
    model.dispose();
  },
});

Deno.test({
  name: "examples guards: non-finite weights are divergence, found with one read",
  ...GPU_TEST,
  async fn() {
    const fake = fakeTrainer(true);
    const watch = await DivergenceWatch.start(fake as unknown as AmpTrainer);
    const good = Tensor.from([1, -2, 3], [3]), bad = Tensor.from([1, Infinity, 3], [3]);
    assert.equal((await watch.check(1, [good])).diverged, null);
    assert.match((await watch.check(1, [good, bad])).diverged!, /weights hold inf or NaN/);
    good.dispose();
    bad.dispose();
  },
});

Deno.test("examples guards: the --save lock refuses a live owner, takes over a stale one, releases once", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "run.safetensors"), notes: string[] = [];
    const lock = await SaveLock.acquire(path, "save", (t) => notes.push(t));
    const owner = JSON.parse(await Deno.readTextFile(`${path}.lock`));
    assert.equal(owner.pid, Deno.pid);
    await assert.rejects(
      () => SaveLock.acquire(path, "save", (t) => notes.push(t)),
      (e) =>
        e instanceof UsageError &&
        // The host is named where Deno may read it (-A, --allow-sys), else from $HOSTNAME.
        new RegExp(`in use by another run \\(pid ${Deno.pid}( on [^)]+)?\\)`).test(e.message),
    );
    lock.release();
    lock.release(); // once
    assert.ok(!(await Deno.stat(`${path}.lock`).then(() => true, () => false)));
    // A lock file left by a run that was killed (SIGKILL): the OS dropped its lock.
    await Deno.writeTextFile(`${path}.lock`, JSON.stringify({ pid: 4242, host: "" }));
    const again = await SaveLock.acquire(path, "save", (t) => notes.push(t));
    assert.deepEqual(notes, [`taking over ${path}.lock: pid 4242 is gone`]);
    again.release();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "examples guards: the --save lock follows a symbolic link to the file it names",
  ignore: Deno.build.os === "windows",
  async fn() {
    await withTempDir(async (dir) => {
      const file = join(dir, "run.safetensors"), link = join(dir, "latest.safetensors");
      await Deno.writeTextFile(file, "a run");
      await Deno.symlink(file, link);
      const lock = await SaveLock.acquire(link, "save", () => {});
      try {
        assert.equal(lock.lockPath, `${await Deno.realPath(file)}.lock`);
        // Through the link or by its own name: the same file, one writer.
        await assert.rejects(
          () => SaveLock.acquire(file, "save", () => {}),
          /is in use by another run/,
        );
      } finally {
        lock.release();
      }
    });
  },
});

Deno.test("examples guards: resume flags that shape the run must match; steering ones need --override", () => {
  const saved = { shape: { model: "mlp", batch: 128 }, steering: { lr: 0.002 } };
  const same = { shape: { model: "mlp", batch: 128 }, steering: { lr: 0.002 } };
  assert.deepEqual(checkResumeFlags("f", saved, same, false), []);
  assert.throws(
    () => checkResumeFlags("f", saved, { ...same, shape: { model: "cnn", batch: 64 } }, true),
    /f was saved by a run with other flags: --model cnn \(saved: mlp\), --batch 64 \(saved: 128\)\. Resume with the saved flags\.$/,
  );
  const lr = { ...same, steering: { lr: 0.01 } };
  assert.throws(
    () => checkResumeFlags("f", saved, lr, false),
    /would change --lr 0\.01 \(saved: 0\.002\); give the saved values/,
  );
  assert.deepEqual(checkResumeFlags("f", saved, lr, true), [
    { flag: "lr", saved: 0.002, given: 0.01 },
  ]);
  // A file from before the flags were recorded: the shape alone is checked.
  assert.deepEqual(checkResumeFlags("f", { shape: saved.shape }, lr, false), []);
});
