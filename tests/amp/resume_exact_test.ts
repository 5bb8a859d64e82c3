/**
 * A resumed run continues exactly (issue 26, finding 10): a model with
 * Dropout (whose masks come from a generator that must go on where it
 * stood), BatchNorm, an LR schedule and gradient accumulation, saved in the
 * middle of an effective batch, then loaded into fresh objects built from
 * other seeds, ends bit-identical to the run that was never interrupted:
 * weights, buffers, optimizer state, learning rates, scaler, counters and
 * the generator.
 */
import assert from "node:assert/strict";
import { cosineSchedule, LrScheduler } from "../../mod.ts";
import { loadTrainingState, saveTrainingState } from "../../files.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { ampRun, type Run, snapshot, train } from "../helpers/training_state.ts";

const MICRO_STEPS = 13, SAVED_AFTER = 7; // 7 micro-batches of 2 per step: saved mid-accumulation

/** A run whose LR follows a warmup + cosine schedule, stepped once per optimizer step. */
function scheduledRun(seed: number): Run & { scheduler: LrScheduler } {
  const run = ampRun(seed);
  const schedule = cosineSchedule({ warmupSteps: 2, totalSteps: 6, minFactor: 0.1 });
  return { ...run, scheduler: new LrScheduler(run.optimizer, schedule) };
}

/** Micro-batches `from` … `to − 1`, the scheduler stepped after each optimizer step. */
function trainScheduled(run: Run & { scheduler: LrScheduler }, from: number, to: number): void {
  for (let i = from; i < to; i++) {
    const steps = run.trainer.steps;
    train(run, i, 1);
    if (run.trainer.steps !== steps) run.scheduler.step();
  }
}

async function resumeTest(restoreScheduler: "from the file" | "by steps"): Promise<void> {
  const dir = await Deno.makeTempDir();
  const path = `${dir}/run.safetensors`;
  const straight = scheduledRun(1);
  trainScheduled(straight, 0, MICRO_STEPS);

  const first = scheduledRun(1);
  trainScheduled(first, 0, SAVED_AFTER);
  assert.equal((await first.trainer.stateDict()).microStep, 1);
  assert.ok(first.model.parameters().every((p) => p.grad), "gradients are saved mid-accumulation");
  const parts = restoreScheduler === "from the file" ? first : { ...first, scheduler: undefined };
  await saveTrainingState(path, parts);

  const resumed = scheduledRun(7); // other weights, other Dropout seed: everything comes from the file
  if (restoreScheduler === "from the file") {
    await loadTrainingState(path, resumed);
  } else {
    // What the examples do: the scheduler (made before the load) jumps to the restored step count.
    await loadTrainingState(path, { ...resumed, scheduler: undefined });
    resumed.scheduler.step(resumed.trainer.steps);
  }
  trainScheduled(resumed, SAVED_AFTER, MICRO_STEPS);

  const schedule = (r: typeof straight) => [r.scheduler.stepCount, r.scheduler.lrs];
  assert.deepEqual(schedule(resumed), schedule(straight));
  assert.deepEqual(await snapshot(resumed), await snapshot(straight));
  await Deno.remove(dir, { recursive: true });
}

Deno.test({
  name: "a run with Dropout, a schedule and accumulation resumed mid-batch equals the " +
    "uninterrupted run bit for bit (scheduler restored from the file)",
  ...GPU_TEST,
  fn: () => resumeTest("from the file"),
});

Deno.test({
  name: "the same with the scheduler restored as the examples do: step(trainer.steps)",
  ...GPU_TEST,
  fn: () => resumeTest("by steps"),
});
