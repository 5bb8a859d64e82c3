/**
 * A halfstep training run continues in PyTorch and comes back (issue 32):
 * the examples' MNIST MLP trained in halfstep (AdamW, cosine schedule; f32,
 * then AMP with a GradScaler) is saved, continued 50 steps by
 * examples/torch/continue_ddp.py in one process and in halfstep from the
 * same file (loss trajectories equal within f32 rounding, or close under
 * AMP with the scale equal before and after), continued under
 * DistributedDataParallel with 2 gloo processes (it trains, and both ranks'
 * weights are identical after every step), and the file PyTorch saves
 * resumes in halfstep on the trajectory PyTorch goes on with.
 *
 * Needs a Python with torch (CI installs Debian's python3-torch): without
 * one the test fails, it never skips.
 *
 * Default pass only (.ci/run leaves it out of the Dawn pass): its time goes
 * to PyTorch's processes; halfstep's numerics against PyTorch on Dawn are
 * torch_parity_test.ts's and torch_twins_test.ts's.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { decodeSafetensors } from "../../nn/mod.ts";
import {
  AdamW,
  AmpTrainer,
  cosineSchedule,
  crossEntropy,
  LrScheduler,
  RandomGenerator,
  type Sequential,
  Tensor,
} from "../../mod.ts";
import { loadTrainingState, saveTrainingState } from "../../files.ts";
import { loadData, shuffle } from "../../examples/data/mnist_batches.ts";
import { MNIST_PIXELS, mnistDataDir } from "../../examples/data/mnist.ts";
import { mnistMlp } from "../../examples/mnist/model.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { assertSameStep, runPython } from "../helpers/torch.ts";
import { runTorchScript } from "../helpers/torch_script.ts";

/** What tests/fixtures/torch/adamw_cosine_checkpoint.py prints. */
interface TorchLoop {
  weight: number[];
  exp_avg_sq: number[];
  step: number;
  lr: number;
  group_keys: string[];
  state_keys: string[];
  scheduler_keys: string[];
}

/** Images used, the global batch, steps trained in halfstep and continued elsewhere. */
const LIMIT = 4096, BATCH = 64, TRAINED = 200, CONTINUED = 50, BACK = 20;
const SCRIPT = new URL("../../examples/torch/continue_ddp.py", import.meta.url).pathname;
const dir = await Deno.makeTempDir();
const { train } = await loadData({ limit: LIMIT });
const amp = gpu.f16;

/** The seed of the data order (mnist.ts's generator for --seed 0). */
const ORDER_SEED = 1;
const STEPS_PER_EPOCH = LIMIT / BATCH;

/** The shuffled order of `epoch` (0-based), as mnist.ts draws it: LIMIT numbers an epoch. */
function epochOrder(epoch: number): Uint32Array {
  return shuffle(LIMIT, new RandomGenerator(ORDER_SEED, epoch * LIMIT));
}

/**
 * mnist.ts's record of a run at `step` (its `extra`), for continue_ddp.py:
 * the data order before the epoch in progress and the position in it.
 */
function runRecord(step: number) {
  const epoch = Math.floor(step / STEPS_PER_EPOCH);
  return {
    epoch,
    step,
    position: step % STEPS_PER_EPOCH,
    shuffler: { seed: ORDER_SEED, offset: epoch * LIMIT },
    flags: { shape: { model: "mlp", shift: 0, accum: 1, limit: LIMIT, batch: BATCH, epochs: 7 } },
  };
}

/** The global batch of step `s` (0-based): mnist.ts's shuffled order, as the script follows it. */
function batch(s: number): { x: Tensor; labels: number[] } {
  const order = epochOrder(Math.floor(s / STEPS_PER_EPOCH)), at = (s % STEPS_PER_EPOCH) * BATCH;
  const rows = Array.from(order.subarray(at, at + BATCH));
  const x = new Float32Array(BATCH * MNIST_PIXELS);
  rows.forEach((r, j) =>
    x.set(train.images.subarray(r * MNIST_PIXELS, (r + 1) * MNIST_PIXELS), j * MNIST_PIXELS)
  );
  return { x: Tensor.from(x, [BATCH, MNIST_PIXELS]), labels: rows.map((r) => train.labels[r]) };
}

/** A run as the examples make one: the MLP, AdamW, a cosine schedule, an AmpTrainer. */
interface Run {
  model: Sequential;
  optimizer: AdamW;
  scheduler: LrScheduler;
  trainer: AmpTrainer;
}

function makeRun(withAmp: boolean): Run {
  const model = mnistMlp(7);
  const optimizer = new AdamW(model.parameters(), { lr: 2e-3 });
  const scheduler = new LrScheduler(
    optimizer,
    cosineSchedule({ warmupSteps: 20, totalSteps: 400 }),
  );
  // Growth every 60 clean steps: the scale grows at step 240, while PyTorch runs the run,
  // only if the growth tracker crossed over.
  const trainer = new AmpTrainer(model, optimizer, {
    enabled: withAmp,
    scaler: { initScale: 256, growthInterval: 60 },
  });
  return { model, optimizer, scheduler, trainer };
}

/** One step's loss and learning rate, as both sides log them (PyTorch also the scale before it). */
interface Step {
  step: number;
  loss: number;
  lr: number;
  scale?: number | null;
  /** PyTorch's processes: a digest of the weights after the step. */
  weights?: string;
}

/**
 * Steps `from` … `from + count − 1` of `run`; with `log`, their losses and
 * learning rates (read together at the end: one sync).
 */
async function steps(run: Run, from: number, count: number, log = true): Promise<Step[]> {
  const losses: Tensor[] = [], lrs: number[] = [];
  for (let s = from; s < from + count; s++) {
    lrs.push(run.optimizer.groups[0].lr);
    const { x, labels } = batch(s);
    const loss = run.trainer.step(() => crossEntropy(run.model.forward(x), labels));
    run.scheduler.step();
    x.dispose();
    if (log) losses.push(loss);
    else loss.dispose();
  }
  const values = await Promise.all(losses.map((l) => l.read()));
  for (const l of losses) l.dispose();
  return values.map(([loss], i) => ({ step: from + i, loss, lr: lrs[i], scale: null }));
}

/** A fresh run (other weights) resumed from `path`. */
async function resumed(path: string, withAmp: boolean): Promise<Run> {
  const run = makeRun(withAmp);
  await loadTrainingState(path, run);
  return run;
}

/** Runs continue_ddp.py; returns each rank's log. */
async function continueInTorch(
  path: string,
  options: { procs: number; steps: number; save?: string },
): Promise<Step[][]> {
  const log = join(dir, `log${Math.random().toString(36).slice(2)}`);
  const flags = { mnist: mnistDataDir(), ...options, log };
  const args = Object.entries({ ...flags, device: "cpu" }).filter(([, v]) => v !== undefined)
    .flatMap(([k, v]) => [`--${k}`, `${v}`]);
  await runPython([SCRIPT, path, ...args]);
  return Promise.all(Array.from({ length: options.procs }, async (_, r) => {
    const text = await Deno.readTextFile(`${log}.rank${r}.jsonl`);
    return text.trim().split("\n").map((l) => JSON.parse(l));
  }));
}

/** Asserts two trajectories agree: the same steps and lrs, losses within `tolerance`. */
function assertSameTrajectory(a: Step[], b: Step[], tolerance: number, what: string): number {
  assert.deepEqual(a.map((s) => s.step), b.map((s) => s.step), `${what}: steps`);
  return Math.max(...a.map((s, i) => assertSameStep(s, b[i], tolerance, what)));
}

/** The scaler metadata of a training-state file. */
async function scaler(path: string): Promise<string> {
  return decodeSafetensors(await Deno.readFile(path)).metadata.scaler;
}

/** Mean of a few losses. */
const mean = (l: Step[]) => l.reduce((a, s) => a + s.loss, 0) / l.length;

for (const withAmp of [false, true]) {
  const kind = withAmp ? "AMP (f16, GradScaler)" : "f32";
  // Losses agree within f32 rounding (measured on lavapipe: 1.2e-7), within f16 rounding under AMP,
  // where PyTorch runs f32 on CPUs (4.7e-4).
  const tolerance = withAmp ? 5e-3 : 2e-5;
  Deno.test({
    name: `a halfstep ${kind} MNIST run continues in PyTorch, under DDP, and back in halfstep`,
    ignore: withAmp && !amp,
    ...GPU_TEST,
    async fn() {
      const saved = join(dir, `run_${withAmp}.safetensors`);
      const source = makeRun(withAmp);
      await steps(source, 0, TRAINED, false);
      await saveTrainingState(saved, source, { extra: runRecord(TRAINED) });
      const continued = await resumed(saved, withAmp);
      const scale = () => continued.trainer.scaler.getScale();
      const scales = [await scale()];
      const here = await steps(continued, TRAINED, CONTINUED);
      scales.push(await scale());
      const back = join(dir, `back_${withAmp}.safetensors`);
      const [torch] = await continueInTorch(saved, { procs: 1, steps: CONTINUED, save: back });
      const worst = assertSameTrajectory(here, torch, tolerance, "halfstep vs PyTorch");
      console.log(`${kind}: largest loss difference halfstep vs PyTorch ${worst.toExponential(2)}`);
      if (withAmp) {
        const pytorch = [torch[0].scale, JSON.parse(await scaler(back)).scale];
        assert.deepEqual(scales, pytorch, "the scale before and after, halfstep vs PyTorch");
        assert.ok(scales[1] > scales[0], "the scale grew while continuing");
      }

      const ranks = await continueInTorch(saved, { procs: 2, steps: CONTINUED });
      assert.equal(ranks.length, 2);
      ranks[0].forEach((s, i) => {
        assert.equal(s.weights, ranks[1][i].weights, `both ranks' weights after step ${s.step}`);
      });
      assertSameTrajectory(ranks[0], torch, tolerance, "DDP vs one process");
      assert.ok(
        mean(ranks[0].slice(-10)) < mean(ranks[0].slice(0, 10)),
        "the loss keeps falling under DDP",
      );

      // The way back: PyTorch's file resumes in halfstep where PyTorch goes on.
      const resumedHere = await resumed(back, withAmp);
      if (withAmp) {
        const { scale } = JSON.parse(await scaler(back));
        assert.equal(await resumedHere.trainer.scaler.getScale(), scale, "the scale PyTorch saved");
      }
      const goesOn = await steps(resumedHere, TRAINED + CONTINUED, BACK);
      const [torchGoesOn] = await continueInTorch(back, { procs: 1, steps: BACK });
      assertSameTrajectory(goesOn, torchGoesOn, tolerance, "back in halfstep vs PyTorch");
    },
  });
}

Deno.test({
  name: "a PyTorch checkpoint converted by to_halfstep.py resumes in halfstep, every value kept",
  ...GPU_TEST,
  async fn() {
    const scripts = new URL("../../examples/torch/", import.meta.url).pathname;
    const checkpoint = join(dir, "torch.pt"), path = join(dir, "from_torch.safetensors");
    const torch = await runTorchScript("adamw_cosine_checkpoint.py", [checkpoint]) as TorchLoop;
    const schedule = "cosine:warmup=20,total=400";
    await runPython([
      `${scripts}to_halfstep.py`,
      checkpoint,
      path,
      "--optimizer",
      "AdamW",
      "--schedule",
      schedule,
    ]);
    const run = await resumed(path, false);
    const state = await run.optimizer.stateDict();
    const first50 = (a: Float32Array) => [...a.subarray(0, 50)];
    assert.deepEqual(
      first50(await run.model.stateDict().get("2.weight")!.read() as Float32Array),
      torch.weight,
    );
    assert.deepEqual(first50(state.state[2].buffers.expAvgSq as Float32Array), torch.exp_avg_sq);
    assert.equal(state.step, torch.step);
    assert.equal(run.scheduler.stepCount, 3);
    assert.ok(
      Math.abs(run.optimizer.groups[0].lr - torch.lr) <= 1e-12 * torch.lr,
      "the lr goes on",
    );
    // Saved again by halfstep: the same vocabulary as PyTorch's own state dicts.
    const again = join(dir, "again.safetensors");
    await saveTrainingState(again, run);
    const { metadata, entries } = decodeSafetensors(await Deno.readFile(again));
    const optimizer = JSON.parse(metadata.optimizer);
    assert.equal(optimizer.kind, "AdamW");
    assert.deepEqual(Object.keys(optimizer.param_groups[0]).sort(), torch.group_keys);
    const saved2 = [...entries.keys()].filter((n) => n.startsWith("optimizer.state.2."));
    const state2 = [...Object.keys(optimizer.state[2]), ...saved2.map((n) => n.split(".")[3])];
    assert.deepEqual(state2.sort(), torch.state_keys);
    const scheduler = Object.keys(JSON.parse(metadata.scheduler)).filter((k) => k !== "halfstep");
    assert.deepEqual(scheduler.sort(), torch.scheduler_keys);
  },
});

Deno.test({ name: "(cleanup)", ...GPU_TEST, fn: () => Deno.remove(dir, { recursive: true }) });
