/**
 * Shared by the training-state tests: a small AMP run (a classifier with
 * biases, BatchNorm and Dropout; AdamW or SGD; an AmpTrainer accumulating
 * two micro-batches), a bit-exact snapshot of every piece of its state, and
 * a way to rewrite a saved file.
 */
import {
  AdamW,
  AmpTrainer,
  type AmpTrainerOptions,
  BatchNorm1d,
  crossEntropy,
  Dropout,
  Linear,
  RandomGenerator,
  ReLU,
  Sequential,
  SGD,
  Tensor,
} from "../../mod.ts";
import {
  decodeSafetensors,
  encodeSafetensors,
  type SafetensorsEntry,
} from "../../nn/safetensors.ts";
import type { OptimizerStateDict } from "../../optim/mod.ts";

export const FEATURES = 6, CLASSES = 3;

/** Linear → BatchNorm → ReLU → Dropout → Linear, every weight from `seed`. */
export function classifier(seed: number): Sequential {
  const rng = new RandomGenerator(seed);
  return new Sequential(
    new Linear(FEATURES, 16, { seed: rng }),
    new BatchNorm1d(16),
    new ReLU(),
    new Dropout(0.25, { seed: seed + 100 }),
    new Linear(16, CLASSES, { seed: rng }),
  );
}

/** A deterministic batch: the label is the argmax of three feature sums. */
export function batch(index: number, size = 8): { x: Float32Array; labels: number[] } {
  const x = new RandomGenerator(1000 + index).uniform(size * FEATURES, -1, 1);
  const labels = Array.from({ length: size }, (_, r) => {
    const s = [0, 1, 2].map((c) => x[r * FEATURES + 2 * c] + x[r * FEATURES + 2 * c + 1]);
    return s.indexOf(Math.max(...s));
  });
  return { x, labels };
}

/** A model, its optimizer and its AMP trainer. */
export interface Run {
  model: Sequential;
  optimizer: AdamW | SGD;
  trainer: AmpTrainer;
}

/** A run from `seed`: AdamW (or SGD with momentum), accumulating 2 micro-batches. */
export function ampRun(
  seed: number,
  options: { sgd?: boolean; trainer?: AmpTrainerOptions } = {},
): Run {
  const model = classifier(seed);
  const optimizer = options.sgd
    ? new SGD(model.parameters(), { lr: 0.05, momentum: 0.9 })
    : new AdamW(model.parameters(), { lr: 5e-3 });
  const trainer = new AmpTrainer(model, optimizer, {
    accumulationSteps: 2,
    scaler: { growthInterval: 2 },
    ...options.trainer,
  });
  return { model, optimizer, trainer };
}

/** Micro-batches `from` … `from + count − 1` (their losses disposed). */
export function train(run: Run, from: number, count: number): void {
  for (let i = from; i < from + count; i++) {
    const { x, labels } = batch(i);
    run.trainer.step(() =>
      crossEntropy(run.model.forward(Tensor.from(x, [labels.length, FEATURES])), labels)
    ).dispose();
  }
}

/**
 * Every piece of `run`'s state as bytes and plain values: weights and
 * buffers, gradients, working copies, optimizer state and learning rates,
 * the trainer's (and scaler's) state, the Dropout generator. Two snapshots
 * are deepEqual only when the states are bit-identical. A sync point (every
 * read is started before the first is awaited: one GPU wait).
 */
export async function snapshot(run: Run): Promise<Record<string, unknown>> {
  const reads: [string, Promise<Float32Array | Int32Array> | null][] = [];
  const read = (key: string, t: Tensor | null | undefined) =>
    reads.push([key, t ? t.read() : null]);
  for (const [name, t] of run.model.stateDict()) read(`model.${name}`, t);
  for (const [name, p] of run.model.namedParameters()) {
    read(`grad.${name}`, p.grad);
    read(`copy.${name}`, run.trainer.masters?.copyOf(p));
  }
  const optimizer = run.optimizer.stateDict(), trainer = run.trainer.stateDict();
  const out: Record<string, unknown> = {};
  for (const [key, pending] of reads) {
    out[key] = pending ? new Uint8Array((await pending).buffer) : null;
  }
  out.optimizer = optimizerBytes(await optimizer);
  out.lrs = run.optimizer.groups.map((g) => g.lr);
  out.trainer = await trainer;
  out.dropout = (run.model.children()[3] as Dropout).generator.state();
  return out;
}

/** An optimizer's state dict with its buffers as bytes: deepEqual only when bit-identical. */
export function optimizerBytes(o: OptimizerStateDict): Record<string, unknown> {
  return {
    ...o,
    state: o.state.map((s) => ({
      ...s,
      buffers: Object.fromEntries(
        Object.entries(s.buffers).map(([n, v]) => [n, new Uint8Array(v.buffer)]),
      ),
    })),
  };
}

/** The tensors and metadata of a safetensors file. */
export interface FileParts {
  entries: Map<string, SafetensorsEntry>;
  metadata: Record<string, string>;
}

/**
 * Writes to `out` the file at `path` changed by `edit`, without checksums,
 * so what a test sees is the training-state loader's own check, not the
 * checksum's.
 */
export async function rewrite(
  path: string,
  out: string,
  edit: (file: FileParts) => void,
): Promise<void> {
  const { entries, metadata } = decodeSafetensors(await Deno.readFile(path));
  const file = {
    entries: new Map([...entries].map(([name, e]) => [name, { ...e, data: e.data.slice() }])),
    metadata,
  };
  edit(file);
  await Deno.writeFile(
    out,
    encodeSafetensors(file.entries, { metadata: file.metadata, checksums: false }),
  );
}
