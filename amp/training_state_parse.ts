/**
 * Reading a training-state file into a checked plan. Every tensor name,
 * shape, dtype and value and every metadata field is checked against the
 * live model, optimizer, scheduler and trainer before anything is written:
 * `loadTrainingState` writes nothing unless the whole plan fits (the model's
 * own check runs last, in `Module.loadStateDict`, which is all-or-nothing
 * itself). Failures are one short line: names are cut and values are not
 * echoed.
 */
import {
  checkRandomState,
  fail,
  HalfstepError,
  quoted,
  type RandomGenerator,
  type RandomState,
  sameShape,
  shapeString,
  type Tensor,
  ValueError,
} from "../gpu/mod.ts";
import { type LoadStateOptions, nonFiniteSummary } from "../nn/module.ts";
import type { SafetensorsEntry } from "../nn/safetensors.ts";
import type { LrSchedulerState, OptimizerStateDict } from "../optim/mod.ts";
import { moduleGenerators } from "./module_generators.ts";
import type { TrainingStateParts } from "./training_state_parts.ts";
import {
  liveTorchKind,
  optimizerFromTorch,
  scalerFromTorch,
  schedulerFromTorch,
  trainerFromTorch,
} from "./training_state_torch.ts";
import type { AmpTrainerState } from "./trainer.ts";

/** The format id written in the header's metadata. */
export const FORMAT = "halfstep-training-state-3";
/**
 * Format 2 laid the optimizer, scaler and scheduler out in halfstep's own
 * vocabulary (`optimizer.<param>.<buffer>` tensors, the state dicts as JSON,
 * the scaler inside the trainer's); still read.
 */
const FORMAT_2 = "halfstep-training-state-2";
/**
 * Older formats still, read as format 2: they hold no list of saved
 * gradients and no random generators, so those two checks (and the
 * generators' restore) are skipped.
 */
const LEGACY_FORMATS = ["halfstep-training-state-1", "halfstep-checkpoint-1"];

/** What a file holds, checked against the live objects, ready to be written into them. */
export interface TrainingStatePlan {
  /** `model.*` tensors, by the model's names (checked by `Module.loadStateDict`). */
  model: Map<string, SafetensorsEntry>;
  /** Every parameter's gradient to restore (null: none). */
  grads: Map<Tensor, SafetensorsEntry | null>;
  /** The optimizer's state (null when the parts have no optimizer). */
  optimizer: OptimizerStateDict | null;
  /** The LR scheduler's state (null when the parts have no scheduler). */
  scheduler: LrSchedulerState | null;
  /** The trainer's state (null when the parts have no trainer). */
  trainer: AmpTrainerState | null;
  /** Where each of the model's random generators stood. */
  generators: { generator: RandomGenerator; state: RandomState }[];
  /** The user's `extra` value. */
  extra: unknown;
}

/** Format 2's optimizer state in the metadata: buffers by name, their data in `optimizer.*` tensors. */
type OptimizerSkeleton = Omit<OptimizerStateDict, "state"> & {
  state: { param: number; shape: number[]; buffers: string[] }[];
};

/** Throws a one-line ValueError: `where: why; nothing was loaded.` */
export type Reject = (why: string) => never;

/** A rejecter for `path`, its message opening with the function's name and the path. */
export function rejecter(path: string): Reject {
  return (why) =>
    fail(ValueError, `loadTrainingState: ${quoted(path)}`, `${why}; nothing was loaded.`);
}

/** `message` as one line of at most 160 characters (a part's multi-line list of problems). */
export function oneLine(message: string): string {
  const line = message.replace(/:?\n\s*-?\s*/g, "; ")
    .replace(/[;,]? ?\(?nothing was (loaded|changed)\)?/g, "").replace(/\.$/, "");
  return line.length > 160 ? `${line.slice(0, 159)}…` : line;
}

/** Runs `check`; a HalfstepError it throws becomes `reject(what: its message, as one line)`. */
export function checked(what: string, reject: Reject, check: () => void): void {
  try {
    check();
  } catch (e) {
    if (e instanceof HalfstepError) reject(`${what} does not fit: ${oneLine(e.message)}`);
    throw e;
  }
}

/**
 * Checks a whole file against `parts` and returns what to write; throws a
 * one-line ValueError (through `reject`) at the first problem. Writes nothing.
 */
export function planTrainingState(
  file: { entries: Map<string, SafetensorsEntry>; metadata: Record<string, string> },
  parts: TrainingStateParts,
  options: LoadStateOptions,
  reject: Reject,
): TrainingStatePlan {
  const { entries, metadata } = file;
  const legacy = LEGACY_FORMATS.includes(metadata.format);
  const torch = metadata.format === FORMAT;
  if (!torch && metadata.format !== FORMAT_2 && !legacy) {
    reject("not a halfstep training-state file");
  }
  if (!options.allowNonFinite) refuseNonFinite(entries, reject);
  const json = (key: string): unknown => {
    if (typeof metadata[key] !== "string") reject(`it holds no ${key} metadata`);
    try {
      return JSON.parse(metadata[key]);
    } catch {
      return reject(`its ${key} metadata is not valid JSON`);
    }
  };
  const model = new Map<string, SafetensorsEntry>();
  const used = new Set<string>();
  for (const [name, entry] of entries) {
    if (name.startsWith("model.")) (model.set(name.slice(6), entry), used.add(name));
  }
  const grads = gradients(entries, parts, legacy ? null : json("grads"), reject);
  for (const name of entries.keys()) if (name.startsWith("grad.")) used.add(name);
  let optimizer: OptimizerStateDict | null = null;
  if (metadata.optimizer !== undefined && parts.optimizer) {
    const live = parts.optimizer;
    const state = torch
      ? optimizerFromTorch(json("optimizer"), { entries, used }, {
        kind: liveTorchKind(live),
        shapes: live.params.map((p) => p.shape),
      }, reject)
      : optimizerState(json("optimizer"), entries, used, reject);
    checked("its optimizer state", reject, () => live.checkStateDict(state, options));
    optimizer = state;
  } else if (parts.optimizer) reject("it holds no optimizer state");
  else for (const name of entries.keys()) if (name.startsWith("optimizer.")) used.add(name);
  const unknown = [...entries.keys()].find((name) => !used.has(name));
  if (unknown !== undefined) reject(`it holds an unknown tensor ${quoted(unknown)}`);
  let scheduler: LrSchedulerState | null = null;
  if (parts.scheduler) {
    const saved = json("scheduler");
    const state = torch ? schedulerFromTorch(saved, reject) : saved as LrSchedulerState;
    checked("its LR scheduler state", reject, () => parts.scheduler!.checkStateDict(state));
    scheduler = state;
  }
  let trainer: AmpTrainerState | null = null;
  if (parts.trainer) {
    const live = parts.trainer;
    const state = torch
      ? trainerFromTorch(
        json("trainer"),
        scalerFromTorch(json("scaler"), live.scaler.options, reject),
        reject,
      )
      : json("trainer") as AmpTrainerState;
    checked("its AMP trainer state", reject, () => live.checkStateDict(state));
    trainer = state;
  }
  const generators = legacy && metadata.random === undefined
    ? []
    : randomStates(json("random"), parts, reject);
  const extra = legacy && metadata.extra === undefined ? null : json("extra");
  return { model, grads, optimizer, scheduler, trainer, generators, extra };
}

/** Refuses the first tensor holding NaN or ±Inf (naming it and how many more there are). */
function refuseNonFinite(entries: Map<string, SafetensorsEntry>, reject: Reject): void {
  const bad = nonFiniteSummary(entries);
  if (bad === null) return;
  reject(
    `${bad} (NaN or ±Inf: the run had diverged when it was saved); pass ` +
      "{ allowNonFinite: true } to load it anyway",
  );
}

/**
 * Each parameter's saved gradient (`grad.<name>`): a parameter's shape and
 * dtype. `listed` (the names the file says it saved) must match the entries
 * exactly, so a dropped gradient is caught; null for legacy files.
 */
function gradients(
  entries: Map<string, SafetensorsEntry>,
  parts: TrainingStateParts,
  listed: unknown,
  reject: Reject,
): Map<Tensor, SafetensorsEntry | null> {
  const params = new Map(parts.model.namedParameters());
  const saved = [...entries.keys()].filter((n) => n.startsWith("grad.")).map((n) => n.slice(5));
  for (const name of saved) {
    const p = params.get(name), e = entries.get(`grad.${name}`)!;
    if (!p) {
      reject(`it holds a gradient for ${quoted(name)}, which is not a parameter of the model`);
    }
    if (e.dtype !== p.dtype || !sameShape(e.shape, p.shape)) {
      reject(
        `the gradient of ${quoted(name)} is ${e.dtype} ${
          shapeString(e.shape)
        }, its parameter ${p.describe()}`,
      );
    }
  }
  if (listed !== null) {
    const names = Array.isArray(listed) && listed.every((n) => typeof n === "string")
      ? listed
      : null;
    if (!names) reject("its grads metadata is not a list of names");
    const missing = names.find((n) => !saved.includes(n));
    if (missing !== undefined) reject(`the gradient of ${quoted(missing)} is missing`);
    const extra = saved.find((n) => !names.includes(n));
    if (extra !== undefined) {
      reject(`the gradient of ${quoted(extra)} is not in its list of gradients`);
    }
  }
  return new Map([...params].map(([name, p]) => [p, entries.get(`grad.${name}`) ?? null]));
}

/**
 * The optimizer state format 2's metadata describes, with its buffers read from
 * the `optimizer.<param>.<buffer>` tensors (each added to `used`). Checks
 * the description's structure; `checkStateDict` checks the rest.
 */
function optimizerState(
  skeleton: unknown,
  entries: Map<string, SafetensorsEntry>,
  used: Set<string>,
  reject: Reject,
): OptimizerStateDict {
  const s = skeleton as OptimizerSkeleton;
  if (typeof s !== "object" || s === null || !Array.isArray(s.state)) {
    reject("its optimizer metadata holds no list of parameter states");
  }
  const state = s.state.map((p, i) => {
    const ok = typeof p === "object" && p !== null && Number.isSafeInteger(p.param) &&
      Array.isArray(p.shape) && p.shape.every((d) => Number.isSafeInteger(d) && d >= 0) &&
      Array.isArray(p.buffers) &&
      p.buffers.every((b) => typeof b === "string");
    if (!ok) reject(`its optimizer metadata's parameter state ${i} is malformed`);
    const buffers = p.buffers.map((b) => {
      const name = `optimizer.${p.param}.${b}`, e = entries.get(name);
      if (used.has(name)) reject(`the optimizer buffer ${quoted(name)} is listed twice`);
      if (!e) reject(`the optimizer buffer ${quoted(name)} is missing`);
      if (e.dtype !== "f32" || !sameShape(e.shape, p.shape)) {
        reject(
          `the optimizer buffer ${quoted(name)} is ${e.dtype} ${shapeString(e.shape)}, not f32 ${
            shapeString(p.shape)
          }`,
        );
      }
      used.add(name);
      return [b, new Float32Array(e.data.slice().buffer)] as const;
    });
    return { ...p, buffers: Object.fromEntries(buffers) };
  });
  return { ...s, state };
}

/**
 * Where each of the model's generators stood when saved: the saved list must
 * name the same generators, held at the same places, as the model has.
 */
function randomStates(
  saved: unknown,
  parts: TrainingStateParts,
  reject: Reject,
): TrainingStatePlan["generators"] {
  const live = moduleGenerators(parts.model);
  const list = saved as { at: string[]; seed: number; offset: number }[];
  if (!Array.isArray(list) || list.length !== live.length) {
    reject(
      `it holds ${Array.isArray(list) ? list.length : "no list of"} random generator state(s), ` +
        `the model has ${live.length} generator(s)`,
    );
  }
  return live.map(({ generator, at }, i) => {
    const s = list[i];
    if (!Array.isArray(s?.at) || s.at.join("|") !== at.join("|")) {
      reject(
        `its random generator ${i} is not held where the model's is (${quoted(at.join(", "))})`,
      );
    }
    const state = { seed: s.seed, offset: s.offset };
    checked(
      `its random generator ${i} (${quoted(at.join(", "))})`,
      reject,
      () => checkRandomState("RandomGenerator.setState", state),
    );
    return { generator, state };
  });
}
