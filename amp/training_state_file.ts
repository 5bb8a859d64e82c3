/**
 * Training-state files: model, optimizer and AMP state in one safetensors
 * file, written atomically, so a killed run can be resumed exactly. (In
 * halfstep "checkpoint" means gradient checkpointing, the recompute; a saved
 * run is a training state.) Tensors hold the model's parameters and buffers
 * (`model.<name>`), gradients accumulated so far in an unfinished effective
 * batch (`grad.<name>`), and the optimizer's fp32 state (`optimizer.<param>.<buffer>`);
 * the header's metadata holds the rest as JSON (optimizer hyper-parameters
 * and step count, the loss scaler and accumulation counters, user data).
 * Resuming from it continues a run exactly.
 */
import { fail, ValueError } from "../gpu/errors.ts";
import { untracked } from "../gpu/scope.ts";
import { Tensor } from "../gpu/tensor.ts";
import { type LoadStateOptions, type Module, nonFiniteCount } from "../nn/module.ts";
import { entryToTensor, type SafetensorsEntry } from "../nn/safetensors.ts";
import { loadSafetensors, saveSafetensors } from "../nn/safetensors_file.ts";
import type { OptimizerStateDict } from "../optim/mod.ts";
import type { AmpTrainer, AmpTrainerState } from "./trainer.ts";

/** The format id in the header's metadata (0.1 wrote "halfstep-checkpoint-1", still read). */
const FORMAT = "halfstep-training-state-1";
const FORMATS_READ = [FORMAT, "halfstep-checkpoint-1"];

/** An optimizer whose state can be saved (`SGD`, `Adam`, `AdamW`). */
export interface SavableOptimizer {
  /** Its state as plain data (a sync point). */
  stateDict(): Promise<OptimizerStateDict>;
  /** Restores it, all or nothing. */
  loadStateDict(state: OptimizerStateDict): void;
}

/** What a training state holds; only `model` is required. */
export interface TrainingStateParts {
  /** The model. */
  model: Module;
  /** Its optimizer. */
  optimizer?: SavableOptimizer;
  /** The AMP trainer (loss scaler and accumulation counters). */
  trainer?: AmpTrainer;
}

/**
 * Saves `parts` (and JSON-safe `extra` data such as the epoch) to `path`
 * atomically. **A sync point**: reads every tensor back.
 *
 * @param path Destination file.
 * @param parts Model, optimizer and trainer to save.
 * @param extra Any JSON-safe value, returned by {@link loadTrainingState}.
 * @returns When the file is in place.
 * @example
 * ```ts
 * import { AdamW, AmpTrainer, initGpu, Linear } from "../mod.ts";
 * import { saveTrainingState } from "../files.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const dir = await Deno.makeTempDir(), path = `${dir}/run.safetensors`;
 * const model = new Linear(4, 2, { seed: 1 });
 * const optimizer = new AdamW(model.parameters());
 * const trainer = new AmpTrainer(model, optimizer);
 * await saveTrainingState(path, { model, optimizer, trainer }, { epoch: 3 });
 * console.assert((await Deno.stat(path)).isFile);
 * await Deno.remove(dir, { recursive: true });
 * trainer.dispose();
 * gpu.destroy();
 * ```
 */
export async function saveTrainingState(
  path: string,
  parts: TrainingStateParts,
  extra: unknown = null,
): Promise<void> {
  const tensors = new Map<string, Tensor>();
  for (const [name, t] of parts.model.stateDict()) tensors.set(`model.${name}`, t);
  // Mid-accumulation, the gradients summed so far are part of the run's state.
  for (const [name, p] of parts.model.namedParameters()) {
    if (p.grad) tensors.set(`grad.${name}`, p.grad);
  }
  const metadata: Record<string, string> = {
    format: FORMAT,
    extra: JSON.stringify(extra),
  };
  const temporary: Tensor[] = [];
  try {
    if (parts.optimizer) {
      const state = await parts.optimizer.stateDict();
      const skeleton = {
        ...state,
        state: state.state.map((s) => ({ ...s, buffers: Object.keys(s.buffers) })),
      };
      metadata.optimizer = JSON.stringify(skeleton);
      for (const s of state.state) {
        for (const [buffer, values] of Object.entries(s.buffers)) {
          const t = untracked(() => Tensor.from(values, s.shape));
          temporary.push(t);
          tensors.set(`optimizer.${s.param}.${buffer}`, t);
        }
      }
    }
    if (parts.trainer) metadata.trainer = JSON.stringify(await parts.trainer.stateDict());
    await saveSafetensors(path, tensors, { metadata });
  } finally {
    for (const t of temporary) t.dispose();
  }
}

/**
 * Loads a training state into `parts`: the model first (checked completely
 * before anything is written), then the optimizer and the trainer, each
 * all-or-nothing. A truncated, corrupt or mismatched file is a clear error.
 *
 * @param path The file.
 * @param parts Model, optimizer and trainer to restore (the same kinds as saved).
 * @param options `{ allowNonFinite }` to load NaN / ±Inf values anyway (by
 * default a value that is not finite is an error naming the tensor).
 * @returns The `extra` value given to {@link saveTrainingState}.
 * @example
 * ```ts
 * import { AdamW, initGpu, Linear } from "../mod.ts";
 * import { loadTrainingState, saveTrainingState } from "../files.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const dir = await Deno.makeTempDir(), path = `${dir}/run.safetensors`;
 * const model = new Linear(4, 2, { seed: 1 }), optimizer = new AdamW(model.parameters());
 * await saveTrainingState(path, { model, optimizer }, { epoch: 3 });
 * const resumed = new Linear(4, 2, { seed: 2 });
 * const parts = { model: resumed, optimizer: new AdamW(resumed.parameters()) };
 * const { epoch } = await loadTrainingState(path, parts) as { epoch: number };
 * console.assert(epoch === 3 && (await resumed.bias!.read())[0] === (await model.bias!.read())[0]);
 * await Deno.remove(dir, { recursive: true });
 * gpu.destroy();
 * ```
 */
export async function loadTrainingState(
  path: string,
  parts: TrainingStateParts,
  options: LoadStateOptions = {},
): Promise<unknown> {
  const { entries, metadata } = await loadSafetensors(path);
  const where = `loadTrainingState: "${path}"`;
  const reject = (why: string): never => fail(ValueError, where, why);
  if (!options.allowNonFinite) {
    // Weights, gradients and optimizer moments alike, before anything is loaded.
    const bad = [...entries].map(([name, e]) => [name, nonFiniteCount(e)] as const)
      .filter(([, n]) => n > 0);
    if (bad.length > 0) {
      reject(
        `${bad.map(([name, n]) => `${name} holds ${n} non-finite value(s)`).join("; ")} ` +
          "(NaN or ±Inf: the run had diverged when it was saved); nothing was loaded. Pass " +
          "{ allowNonFinite: true } to load it anyway.",
      );
    }
  }
  if (!FORMATS_READ.includes(metadata.format)) reject("not a halfstep training-state file");
  if (parts.optimizer && !metadata.optimizer) reject("it holds no optimizer state");
  if (parts.trainer && !metadata.trainer) reject("it holds no AMP trainer state");
  const model = new Map<string, SafetensorsEntry>();
  for (const [name, entry] of entries) {
    if (name.startsWith("model.")) model.set(name.slice(6), entry);
  }
  try {
    parts.model.loadStateDict(model, options);
  } catch (e) {
    reject((e as Error).message);
  }
  if (parts.optimizer) {
    const skeleton = JSON.parse(metadata.optimizer) as Omit<OptimizerStateDict, "state"> & {
      state: { param: number; shape: number[]; buffers: string[] }[];
    };
    const state: OptimizerStateDict = {
      ...skeleton,
      state: skeleton.state.map((s) => ({
        ...s,
        buffers: Object.fromEntries(
          s.buffers.map((b) => [b, f32Values(entries.get(`optimizer.${s.param}.${b}`), reject)]),
        ),
      })),
    };
    parts.optimizer.loadStateDict(state);
  }
  if (parts.trainer) parts.trainer.loadStateDict(JSON.parse(metadata.trainer) as AmpTrainerState);
  for (const [name, p] of parts.model.namedParameters()) {
    const saved = entries.get(`grad.${name}`);
    p.grad?.dispose();
    p.grad = saved ? untracked(() => entryToTensor(saved, { gpu: p.gpu })) : null;
  }
  return JSON.parse(metadata.extra ?? "null");
}

function f32Values(
  entry: SafetensorsEntry | undefined,
  fail: (why: string) => never,
): Float32Array {
  if (!entry || entry.dtype !== "f32") fail("an optimizer buffer is missing or not f32");
  const bytes = entry!.data;
  return new Float32Array(bytes.slice().buffer, 0, bytes.byteLength / 4);
}
