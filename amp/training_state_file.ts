/**
 * Training-state files: model, optimizer and AMP state in one safetensors
 * file, written atomically, so a killed run can be resumed exactly. (In
 * halfstep "checkpoint" means gradient checkpointing, the recompute; a saved
 * run is a training state.) The layout is PyTorch's checkpoint dict
 * flattened (`training_state_torch.ts`), so `examples/torch/` continues a run
 * in PyTorch and writes one back:
 *
 * - tensors: `model.<name>` (the model's state dict), `optimizer.state.<i>.<key>`
 *   (`exp_avg`, `exp_avg_sq`, `momentum_buffer` of parameter i; Adam's 8-bit
 *   and bf16 moments dequantized to f32, with their exact form under
 *   `optimizer.compact.<i>.<key>`, which halfstep resumes from), and, saved
 *   mid-accumulation, `grad.<name>` (the gradients summed so far);
 * - metadata, as JSON: `optimizer` (`optimizer.state_dict()` without its
 *   tensors: per-parameter `step`, `param_groups` with PyTorch's keys; plus
 *   `kind`), `scaler` (`GradScaler.state_dict()`), `scheduler`
 *   (`LambdaLR.state_dict()`), each with halfstep's own fields under
 *   `halfstep`; and halfstep's `trainer` (counters and AMP dtype: a bf16 run
 *   does not resume in f16), `grads` (which gradients
 *   were saved), `random` (where each random generator of the model stands:
 *   Dropout masks), `extra` (user data), `format`.
 *
 * Older formats (`halfstep-training-state-2` and before) are still read.
 * Loading checks everything (`training_state_parse.ts`) before it writes anything.
 */
import {
  checkOptionNames,
  fail,
  HalfstepError,
  Tensor,
  untracked,
  ValueError,
} from "../gpu/mod.ts";
import type { LoadStateOptions } from "../nn/module.ts";
import { entryToTensor, type SafetensorsEntry } from "../nn/safetensors.ts";
import { loadSafetensors, writeTensors } from "../nn/safetensors_file.ts";
import { moduleGenerators } from "./module_generators.ts";
import {
  optimizerToTorch,
  scalerToTorch,
  schedulerToTorch,
  trainerToTorch,
} from "./training_state_torch.ts";
import type { TrainingStateParts } from "./training_state_parts.ts";
import {
  FORMAT,
  oneLine,
  planTrainingState,
  type Reject,
  rejecter,
  type TrainingStatePlan,
} from "./training_state_parse.ts";

export type { SavableOptimizer, TrainingStateParts } from "./training_state_parts.ts";

/** Options of {@link saveTrainingState}. */
export interface SaveTrainingStateOptions {
  /** Any JSON-safe value (the epoch, the data order), returned by {@link loadTrainingState}. */
  extra?: unknown;
  /**
   * Save NaN / ±Inf weights, gradients or optimizer state anyway (default
   * false: the save is refused, naming the tensor, and the file already at
   * `path` stays as it was, so a diverged run never replaces a good state).
   */
  allowNonFinite?: boolean;
}

/**
 * Saves `parts` (and JSON-safe `options.extra` data such as the epoch) to
 * `path` atomically. Refuses, by default, a state holding NaN or ±Inf (the
 * run has diverged): the file at `path` is left as it was. **A sync point**:
 * reads every tensor back.
 *
 * @param path Destination file.
 * @param parts Model, optimizer, trainer and scheduler to save.
 * @param options `extra` (returned by {@link loadTrainingState}) and `allowNonFinite`.
 * @returns When the file is in place.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AdamW, AmpTrainer, initGpu, Linear } from "../mod.ts";
 * import { saveTrainingState } from "../files.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const dir = await Deno.makeTempDir(), path = `${dir}/run.safetensors`;
 * const model = new Linear(4, 2, { seed: 1 });
 * const optimizer = new AdamW(model.parameters());
 * const trainer = new AmpTrainer(model, optimizer);
 * await saveTrainingState(path, { model, optimizer, trainer }, { extra: { epoch: 3 } });
 * assert.ok((await Deno.stat(path)).isFile);
 * await Deno.remove(dir, { recursive: true });
 * trainer.dispose();
 * gpu.destroy();
 * ```
 */
export async function saveTrainingState(
  path: string,
  parts: TrainingStateParts,
  options: SaveTrainingStateOptions = {},
): Promise<void> {
  const where = "saveTrainingState";
  checkOptionNames(
    where,
    options,
    ["extra", "allowNonFinite"],
    "pass your own data as { extra } (it was the third argument in earlier versions).",
  );
  let extra: string;
  try {
    extra = JSON.stringify(options.extra ?? null);
  } catch (e) {
    return fail(ValueError, where, `extra must be JSON-safe (${(e as Error).message}).`);
  }
  const tensors = new Map<string, Tensor | SafetensorsEntry>();
  for (const [name, t] of parts.model.stateDict()) tensors.set(`model.${name}`, t);
  // Mid-accumulation, the gradients summed so far are part of the run's state.
  const grads: string[] = [];
  for (const [name, p] of parts.model.namedParameters()) {
    if (p.grad) (tensors.set(`grad.${name}`, p.grad), grads.push(name));
  }
  const random = moduleGenerators(parts.model).map(({ at, generator }) => ({
    at,
    ...generator.state(),
  }));
  const metadata: Record<string, string> = {
    format: FORMAT,
    extra,
    grads: JSON.stringify(grads),
    random: JSON.stringify(random),
  };
  const temporary: Tensor[] = [];
  try {
    if (parts.optimizer) {
      const state = await parts.optimizer.stateDict();
      const torch = optimizerToTorch(state, parts.scheduler?.baseLrs ?? null);
      metadata.optimizer = JSON.stringify(torch.metadata);
      for (const { name, shape, data } of torch.tensors) {
        const t = untracked(() => Tensor.from(data, shape));
        temporary.push(t);
        tensors.set(name, t);
      }
      for (const { name, entry } of torch.compact) tensors.set(name, entry);
    }
    if (parts.trainer) {
      const state = await parts.trainer.stateDict();
      metadata.scaler = JSON.stringify(scalerToTorch(state.scaler));
      metadata.trainer = JSON.stringify(trainerToTorch(state));
    }
    if (parts.scheduler) {
      const { scheduler } = parts;
      metadata.scheduler = JSON.stringify(schedulerToTorch(scheduler.stateDict(), scheduler.lrs));
    }
    await writeTensors("saveTrainingState", path, tensors, {
      metadata,
      allowNonFinite: options.allowNonFinite,
    });
  } finally {
    for (const t of temporary) t.dispose();
  }
}

/**
 * Loads a training state into `parts`, all or nothing: every tensor name,
 * shape, dtype and value and every metadata field (optimizer kind, groups
 * and buffers, scheduler, trainer and scaler fields, random generators,
 * which gradients were saved, `extra`) is checked against the live objects
 * first; on any problem one short line says what, and nothing changed. Then
 * the model, optimizer, scheduler, random generators, gradients and trainer
 * are written.
 *
 * @param path The file.
 * @param parts Model, optimizer, trainer and scheduler to restore (the same kinds as saved).
 * @param options `{ allowNonFinite }` to load NaN / ±Inf values anyway (by
 * default a value that is not finite is an error naming the tensor).
 * @returns The `extra` value given to {@link saveTrainingState}.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AdamW, initGpu, Linear } from "../mod.ts";
 * import { loadTrainingState, saveTrainingState } from "../files.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const dir = await Deno.makeTempDir(), path = `${dir}/run.safetensors`;
 * const model = new Linear(4, 2, { seed: 1 }), optimizer = new AdamW(model.parameters());
 * await saveTrainingState(path, { model, optimizer }, { extra: { epoch: 3 } });
 * const resumed = new Linear(4, 2, { seed: 2 });
 * const parts = { model: resumed, optimizer: new AdamW(resumed.parameters()) };
 * const { epoch } = await loadTrainingState(path, parts) as { epoch: number };
 * assert.equal(epoch, 3);
 * assert.equal((await resumed.bias!.read())[0], (await model.bias!.read())[0]);
 * await Deno.remove(dir, { recursive: true });
 * gpu.destroy();
 * ```
 */
export async function loadTrainingState(
  path: string,
  parts: TrainingStateParts,
  options: LoadStateOptions = {},
): Promise<unknown> {
  const file = await loadSafetensors(path);
  const reject = rejecter(path);
  const plan = planTrainingState(file, parts, options, reject);
  writeTrainingState(plan, parts, options, reject);
  return plan.extra;
}

/**
 * Writes a checked plan. The model goes first: its own check (names after
 * upgrades, shapes, dtypes) is the last that can fail, and it writes nothing
 * when it does; everything after it was checked already.
 */
function writeTrainingState(
  plan: TrainingStatePlan,
  parts: TrainingStateParts,
  options: LoadStateOptions,
  reject: Reject,
): void {
  try {
    parts.model.loadStateDict(plan.model, options);
  } catch (e) {
    if (e instanceof HalfstepError) reject(`its model state does not fit: ${oneLine(e.message)}`);
    throw e;
  }
  if (plan.optimizer) parts.optimizer!.loadStateDict(plan.optimizer, options);
  if (plan.scheduler) parts.scheduler!.loadStateDict(plan.scheduler);
  for (const { generator, state } of plan.generators) generator.setState(state);
  for (const [p, saved] of plan.grads) {
    p.grad?.dispose();
    p.grad = saved ? untracked(() => entryToTensor(saved, { gpu: p.gpu })) : null;
  }
  // Last: the trainer refreshes the working copies from the loaded masters.
  if (plan.trainer) parts.trainer!.loadStateDict(plan.trainer);
}
