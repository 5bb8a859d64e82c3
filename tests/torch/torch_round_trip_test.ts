/**
 * The round trip through PyTorch continues the same run (issue 39): an
 * `examples/mnist.ts` run saved mid-schedule (after epoch 1 of 3), continued
 * 50 steps by `examples/torch/continue_ddp.py` under DistributedDataParallel
 * with 2 gloo processes (the run's batch split over them, its shuffled data
 * order, its schedule from its step; stopping 10 steps into epoch 3) and
 * resumed by mnist.ts from the file PyTorch saved, ends where 50 more
 * halfstep steps and the rest of the run would: the same step count and
 * learning rate at every step, and losses within 1e-4 (f32: the two sides
 * differ only in summation order: 1.2e-7 and 1.5e-7 measured on lavapipe).
 *
 * Needs a Python with torch (CI installs Debian's python3-torch): without
 * one the test fails, it never skips.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { decodeSafetensors } from "../../mod.ts";
import { mnistDataDir } from "../../examples/data/mnist.ts";
import { afterFirstSave, events, MNIST, run, withTempDir } from "../helpers/examples.ts";
import { assertSameStep, type LoggedStep, runPython } from "../helpers/torch.ts";

/** 2560 images in batches of 64: 40 steps an epoch, 120 in the run; DDP goes 50 from step 40. */
const FLAGS = ["--limit", "2560", "--batch", "64", "--epochs", "3", "--log-every", "1", "--json"];
const CONTINUED = 50;
const SCRIPT = new URL("../../examples/torch/continue_ddp.py", import.meta.url).pathname;
/** Losses agree within f32 rounding: the issue asks for 1e-4. */
const TOLERANCE = 1e-4;

type Step = LoggedStep;

/** The step events of a mnist.ts --json run (step = steps done after it, 1-based). */
function stepsOf(stdout: string): Step[] {
  return events(stdout).filter((e) => e.event === "step").map((e) => e as unknown as Step);
}

/** Asserts `got` follows `want` step for step (see assertSameStep); the worst loss gap. */
function assertSameSteps(got: Step[], want: Map<number, Step>, what: string): number {
  return Math.max(...got.map((s) => {
    const w = want.get(s.step);
    assert.ok(w, `${what}: step ${s.step} is one of the reference's`);
    return assertSameStep(s, w, TOLERANCE, what);
  }));
}

/** Whether a file's raw header holds halfstep's checksums (decoding verifies and drops them). */
async function hasChecksums(path: string): Promise<boolean> {
  const bytes = await Deno.readFile(path);
  const length = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + length)));
  return typeof header.__metadata__?.["halfstep.checksums"] === "string";
}

/** The metadata of a training-state file, JSON fields parsed. */
async function metadataOf(path: string): Promise<Record<string, unknown>> {
  const { metadata } = decodeSafetensors(await Deno.readFile(path));
  return Object.fromEntries(
    Object.entries(metadata).map(([k, v]) => [k, k === "format" ? v : JSON.parse(v)]),
  );
}

Deno.test("round trip: a halfstep run continued 50 steps under DDP (2 gloo ranks) and brought back ends where 50 more halfstep steps would", async () => {
  await withTempDir(async (dir) => {
    const saved = join(dir, "run.safetensors");
    // Killed right after epoch 1 (step 40) was saved: mid-schedule.
    const killed = await afterFirstSave([...FLAGS, "--save", saved], () => "kill");
    assert.ok(events(killed.stdout).some((e) => e.event === "save"), killed.stderr);
    // Halfstep alone: the rest of the run (steps 41 … 120).
    const reference = join(dir, "reference.safetensors");
    await Deno.copyFile(saved, reference);
    const alone = await run(MNIST, [...FLAGS, "--resume", reference, "--save", reference]);
    assert.equal(alone.code, 0, alone.stderr);
    const want = new Map(stepsOf(alone.stdout).map((s) => [s.step, s]));
    assert.deepEqual([...want.keys()], Array.from({ length: 80 }, (_, i) => 41 + i));

    // 50 steps in PyTorch, 2 processes, saved back 10 steps into epoch 3.
    const back = join(dir, "back.safetensors"), log = join(dir, "ddp");
    const args = [saved, "--mnist", mnistDataDir(), "--procs", "2", "--steps", `${CONTINUED}`];
    const printed = await runPython([
      SCRIPT,
      ...args,
      ...["--save", back, "--log", log, "--device", "cpu"],
    ]);
    assert.match(printed, /continue_ddp: step 90 \(50\/50; epoch 3, 10\/40\)\s+loss [\d.]+\s+lr /);
    const ranks = await Promise.all(
      [0, 1].map(async (r) =>
        (await Deno.readTextFile(`${log}.rank${r}.jsonl`)).trim().split("\n").map((l) =>
          JSON.parse(l)
        )
      ),
    );
    ranks[0].forEach((s, i) => assert.equal(s.weights, ranks[1][i].weights, `ranks agree at ${i}`));
    // The log counts steps from 0 (the step about to run): step s there is mnist's step s + 1.
    const ddp = ranks[0].map((s) => ({ step: s.step + 1, loss: s.loss, lr: s.lr }));
    assert.deepEqual(ddp.map((s) => s.step), Array.from({ length: 50 }, (_, i) => 41 + i));
    const worstDdp = assertSameSteps(ddp, want, "DDP vs halfstep");

    // The file PyTorch wrote: where 50 more halfstep steps would be, checksummed.
    const meta = await metadataOf(back);
    const record = meta.extra as Record<string, unknown>;
    assert.deepEqual(
      { step: record.step, epoch: record.epoch, position: record.position },
      { step: 90, epoch: 2, position: 10 },
    );
    const scheduler = meta.scheduler as { last_epoch: number; _last_lr: number[] };
    assert.equal(scheduler.last_epoch, 90, "the schedule's step");
    assert.ok(Math.abs(scheduler._last_lr[0] - want.get(91)!.lr) <= 1e-12 * want.get(91)!.lr);
    assert.equal((meta.trainer as { steps: number }).steps, 90);
    assert.ok(await hasChecksums(back), "written with checksums (decoding verified them)");

    // Back in halfstep: steps 91 … 120, on the reference's trajectory.
    const resumed = await run(MNIST, [...FLAGS, "--resume", back, "--save", back]);
    assert.equal(resumed.code, 0, resumed.stderr);
    assert.match(
      events(resumed.stdout).find((e) => e.event === "resume")!.path as string,
      /back\.safetensors$/,
    );
    const after = stepsOf(resumed.stdout);
    assert.deepEqual(after.map((s) => s.step), Array.from({ length: 30 }, (_, i) => 91 + i));
    const worstBack = assertSameSteps(after, want, "back in halfstep vs halfstep alone");
    const [end, endAlone] = [resumed, alone].map((r) => events(r.stdout).at(-1)!);
    assert.equal(end.steps, 120);
    assert.equal(end.steps, endAlone.steps, "the same step count");
    assert.equal(end.optimizerSteps, endAlone.optimizerSteps);
    console.log(
      `round trip: largest loss gap ${worstDdp.toExponential(2)} under DDP, ` +
        `${worstBack.toExponential(2)} back in halfstep`,
    );
  });
});
