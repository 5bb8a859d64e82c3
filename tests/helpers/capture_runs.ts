/**
 * Shared by the capture tests: a training run of the MLP or the tiny GPT in
 * a chosen precision (f32, f16 AMP, bf16), accumulation, checkpointing,
 * dropout and learning-rate schedule, stepped eagerly (`trainer.step`) or
 * captured (`step.run`) over the same deterministic batches, and a
 * bit-exact snapshot of every piece of its state.
 */
import {
  AdamW,
  AmpTrainer,
  type AmpTrainerOptions,
  type CapturedStep,
  cosineSchedule,
  crossEntropy,
  Dropout,
  Linear,
  LrScheduler,
  type Module,
  RandomGenerator,
  ReLU,
  Sequential,
  Tensor,
} from "../../mod.ts";
import { moduleGenerators } from "../../amp/module_generators.ts";
import { Gpt } from "../../models/mod.ts";
import { optimizerBytes } from "./training_state.ts";

/** What a run trains and how. */
export interface RunSetup {
  model: "mlp" | "gpt";
  /** false: plain f32; else the AMP dtype. */
  amp: false | "f16" | "bf16";
  accumulation?: number;
  checkpoint?: boolean;
  dropout?: boolean;
  /** Warmup + cosine learning rates, stepped after each optimizer step. */
  schedule?: boolean;
  /** Loss scale 2^24 that grows every 2 clean steps (f16 overflows again and again), and an Inf batch. */
  overflow?: boolean;
  /** Clip gradients to this norm. */
  clip?: number;
}

export const MLP = { features: 12, hidden: 16, classes: 5, batch: 6 };
export const GPT = { vocab: 11, context: 8, layers: 2, dim: 16, heads: 2, batch: 2 };

/** A model, its optimizer, trainer and scheduler, built from `seed`. */
export interface Run {
  setup: RunSetup;
  model: Module;
  optimizer: AdamW;
  trainer: AmpTrainer;
  scheduler: LrScheduler | null;
  loss: (x: Tensor, y: Tensor) => Tensor;
}

/** The MLP 12-16-16-5 (with Dropout when asked) or the tiny GPT, weights from `seed`. */
function model(setup: RunSetup, seed: number): Module {
  if (setup.model === "gpt") {
    const gpt = new Gpt({ ...GPT, seed, dropout: setup.dropout ? 0.2 : 0 });
    if (setup.checkpoint) gpt.blocks.checkpoint = GPT.layers;
    return gpt;
  }
  const rng = new RandomGenerator(seed);
  const mlp = new Sequential(
    new Linear(MLP.features, MLP.hidden, { seed: rng }),
    new ReLU(),
    ...(setup.dropout ? [new Dropout(0.25, { seed: seed + 100 })] : []),
    new Linear(MLP.hidden, MLP.hidden, { seed: rng }),
    new ReLU(),
    new Linear(MLP.hidden, MLP.classes, { seed: rng }),
  );
  if (setup.checkpoint) mlp.checkpoint = 2;
  return mlp;
}

/** A run of `setup` from `seed` (also the Dropout seed: another seed, other masks). */
export function makeRun(setup: RunSetup, seed = 1, trainer: AmpTrainerOptions = {}): Run {
  const m = model(setup, seed);
  const optimizer = new AdamW(m.parameters(), { lr: 3e-3 });
  const options: AmpTrainerOptions = {
    enabled: setup.amp !== false,
    dtype: setup.amp === "bf16" ? "bf16" : "f16",
    accumulationSteps: setup.accumulation ?? 1,
    maxGradNorm: setup.clip,
    ...(setup.overflow && { scaler: { initScale: 2 ** 24, maxScale: 2 ** 24, growthInterval: 2 } }),
    ...trainer,
  };
  const schedule = cosineSchedule({ warmupSteps: 3, totalSteps: 15, minFactor: 0.1 });
  return {
    setup,
    model: m,
    optimizer,
    trainer: new AmpTrainer(m, optimizer, options),
    scheduler: setup.schedule ? new LrScheduler(optimizer, schedule) : null,
    loss: (x, y) => crossEntropy(m.forward(x), y),
  };
}

/** The batch of micro-batch `index` of `setup`'s model: inputs and i32 targets. */
export function makeBatch(setup: RunSetup, index: number): [Tensor, Tensor] {
  const rng = new RandomGenerator(5000 + index);
  if (setup.model === "gpt") {
    const n = GPT.batch * GPT.context;
    const ids = Array.from(rng.uniform(n + 1), (u) => Math.floor(u * GPT.vocab));
    return [
      Tensor.from(ids.slice(0, n), [GPT.batch, GPT.context], { dtype: "i32" }),
      Tensor.from(ids.slice(1), [n], { dtype: "i32" }),
    ];
  }
  const x = rng.uniform(MLP.batch * MLP.features, -1, 1);
  // An Inf in one batch overflows the gradients: that step is skipped (and f32 gives NaN, so only AMP gets it).
  if (setup.overflow && index === 9) x[3] = Infinity;
  const y = Array.from({ length: MLP.batch }, (_, r) => (r + index) % MLP.classes);
  return [Tensor.from(x, [MLP.batch, MLP.features]), Tensor.from(y, [MLP.batch], { dtype: "i32" })];
}

/**
 * Micro-batches `from` … `to − 1`, eagerly (`trainer.step`) or through
 * `step`; the scheduler steps after each optimizer step. Returns the
 * losses (the caller reads and disposes them).
 */
export function train(run: Run, from: number, to: number, step: CapturedStep | null): Tensor[] {
  const losses: Tensor[] = [];
  for (let i = from; i < to; i++) {
    const [x, y] = makeBatch(run.setup, i);
    const steps = run.trainer.steps;
    losses.push(step ? step.run(x, y) : run.trainer.step(() => run.loss(x, y)));
    if (run.trainer.steps !== steps) run.scheduler?.step();
    x.dispose();
    y.dispose();
  }
  return losses;
}

/** The losses' bits, and the tensors disposed. */
export async function lossBits(losses: Tensor[]): Promise<number[]> {
  const out: number[] = [];
  for (const l of losses) {
    out.push(new Uint32Array((await l.read()).buffer)[0]);
    l.dispose();
  }
  return out;
}

/**
 * Every piece of `run`'s state as bytes and plain values: weights and
 * buffers, gradients, working copies, optimizer state and learning rates,
 * the trainer's (and scaler's) state, the random generators. Two snapshots
 * are deepEqual only when the states are bit-identical. A sync point.
 */
export async function snapshot(run: Run): Promise<Record<string, unknown>> {
  const bytes = async (t: Tensor | null | undefined) =>
    t ? new Uint8Array((await t.read()).buffer) : null;
  const out: Record<string, unknown> = {};
  for (const [name, t] of run.model.stateDict()) out[`model.${name}`] = await bytes(t);
  for (const [name, p] of run.model.namedParameters()) {
    out[`grad.${name}`] = await bytes(p.grad);
    out[`copy.${name}`] = await bytes(run.trainer.masters?.copyOf(p));
  }
  out.optimizer = optimizerBytes(await run.optimizer.stateDict());
  out.lrs = run.optimizer.groups.map((g) => g.lr);
  out.trainer = await run.trainer.stateDict();
  out.generators = moduleGenerators(run.model).map((g) => g.generator.state());
  return out;
}

/** Frees a run. */
export function disposeRun(run: Run): void {
  run.trainer.dispose();
  run.optimizer.dispose();
  run.model.dispose();
}
