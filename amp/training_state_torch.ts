/**
 * A training run in PyTorch's vocabulary: how the optimizer, the loss scaler
 * and the LR scheduler of a training-state file are laid out, so that a
 * PyTorch program reads them as `optimizer.state_dict()`,
 * `GradScaler.state_dict()` and `LambdaLR.state_dict()` (as torch 1.13 writes
 * them), and halfstep reads what such a program writes back.
 *
 * A flat tensor name is the path into PyTorch's checkpoint dict:
 * `optimizer.state.3.exp_avg` is `checkpoint["optimizer"]["state"][3]["exp_avg"]`.
 * The metadata key of the same name holds the rest of that dict as JSON
 * (tensors left out), plus `kind` (the optimizer's class) and `halfstep`, the
 * fields PyTorch's objects do not have. Reading checks structure and the
 * values PyTorch could hold that halfstep cannot honour (amsgrad, dampening,
 * per-parameter step counts that differ); each object's own `checkStateDict`
 * checks the rest.
 */
import { fail, quoted, sameShape, shapeString, ValueError } from "../gpu/mod.ts";
import type { SafetensorsEntry } from "../nn/safetensors.ts";
import {
  Adam,
  dequantizeStates,
  type LrSchedulerState,
  type OptimizerStateDict,
  SGD,
  type StateBuffer,
} from "../optim/mod.ts";
import type { GradScalerState } from "./grad_scaler.ts";
import type { AmpTrainerState, TrainerPrecision } from "./trainer.ts";

/** A JSON object as parsed. */
type Json = Record<string, unknown>;
/** Throws a one-line error (see `training_state_parse.ts`). */
type Reject = (why: string) => never;

/** The optimizer classes both sides have. */
export type TorchOptimizerKind = "Adam" | "AdamW" | "SGD";

/** halfstep's buffer names → PyTorch's per-parameter state keys. */
const BUFFER_NAMES: Readonly<Record<string, string>> = {
  expAvg: "exp_avg",
  expAvgSq: "exp_avg_sq",
  momentumBuffer: "momentum_buffer",
};
/** PyTorch's group options → halfstep's hyper-parameters, for each kind. */
const HYPER_NAMES: Readonly<Record<TorchOptimizerKind, Readonly<Record<string, string>>>> = {
  Adam: { lr: "lr", betas: "betas", eps: "eps", weight_decay: "weightDecay" },
  AdamW: { lr: "lr", betas: "betas", eps: "eps", weight_decay: "weightDecay" },
  SGD: { lr: "lr", momentum: "momentum", weight_decay: "weightDecay", nesterov: "nesterov" },
};
/**
 * The other group options torch 1.13 writes, at the one value halfstep's
 * fused kernels implement. On reading, any other option that is false, 0 or
 * null is accepted (later PyTorch versions add switches off by default).
 */
const FIXED_OPTIONS: Readonly<Record<TorchOptimizerKind, Json>> = {
  Adam: {
    amsgrad: false,
    maximize: false,
    foreach: null,
    capturable: false,
    differentiable: false,
    fused: false,
  },
  AdamW: { amsgrad: false, foreach: null, maximize: false, capturable: false },
  SGD: { dampening: 0, maximize: false, foreach: null, differentiable: false },
};
/** Options that choose how PyTorch runs an update, not what it computes (and the scheduler's base). */
const HOW_TO_RUN = ["foreach", "capturable", "differentiable", "fused", "initial_lr"];

/** The PyTorch class of a halfstep optimizer state ("Adam" with decoupled weight decay is AdamW). */
export function torchKindOf(s: OptimizerStateDict): string {
  if (s.kind === "Adam") return s.settings.decoupledWeightDecay ? "AdamW" : "Adam";
  return s.kind;
}

/** The PyTorch class of a live optimizer, or null for one that is not halfstep's. */
export function liveTorchKind(optimizer: unknown): TorchOptimizerKind | null {
  if (optimizer instanceof Adam) return optimizer.decoupledWeightDecay ? "AdamW" : "Adam";
  return optimizer instanceof SGD ? "SGD" : null;
}

/** An optimizer state as a file holds it: JSON metadata and `optimizer.state.*` tensors. */
export interface TorchOptimizerFile {
  /** `optimizer.state_dict()` without its tensors, plus `kind` and halfstep's extras. */
  metadata: Json;
  /** Each state buffer under its flat name (compact moments dequantized, as torch.optim.AdamW holds them). */
  tensors: { name: string; shape: number[]; data: Float32Array }[];
  /** Compact moments as halfstep keeps them, under {@link COMPACT_PREFIX} (see `compactEntries`). */
  compact: { name: string; entry: SafetensorsEntry }[];
}

/**
 * Prefix of Adam's compact moments in a file (`optimizer.compact.<i>.<key>`).
 * PyTorch reads the dequantized `optimizer.state.*` ones; halfstep resumes
 * from these, bit for bit.
 */
export const COMPACT_PREFIX = "optimizer.compact.";

/** halfstep's compact buffer names → their keys under {@link COMPACT_PREFIX}. */
const COMPACT_NAMES: Readonly<Record<string, string>> = {
  expAvg: "exp_avg",
  expAvgSq: "exp_avg_sq",
  expAvgAbsmax: "exp_avg_absmax",
  expAvgSqAbsmax: "exp_avg_sq_absmax",
};

/**
 * A parameter's compact buffers as file entries: 8-bit codes packed four to
 * an i32 word (`exp_avg`, `exp_avg_sq`: [⌈n/4⌉], byte e of word w is element
 * 4w + e, the last word's spare bytes 0), f32 block scales
 * (`exp_avg_absmax`, `exp_avg_sq_absmax`), bf16 bits as a bf16 tensor
 * shaped like the parameter.
 */
function compactEntries(
  i: number,
  shape: number[],
  buffers: Record<string, StateBuffer>,
): TorchOptimizerFile["compact"] {
  return Object.entries(buffers).map(([ours, data]) => {
    const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    const name = `${COMPACT_PREFIX}${i}.${COMPACT_NAMES[ours]}`;
    if (data instanceof Uint16Array) return { name, entry: { dtype: "bf16", shape, data: bytes } };
    if (data instanceof Float32Array) {
      return { name, entry: { dtype: "f32", shape: [data.length], data: bytes.slice() } };
    }
    const padded = new Uint8Array(Math.ceil(data.length / 4) * 4);
    padded.set(bytes);
    return { name, entry: { dtype: "i32", shape: [padded.length / 4], data: padded } };
  });
}

/**
 * `s` laid out as PyTorch's `optimizer.state_dict()`. `baseLrs` (a
 * scheduler's) become each group's `initial_lr`, as PyTorch's schedulers
 * leave it. Adam's one step count is every parameter's `step`.
 */
export function optimizerToTorch(
  s: OptimizerStateDict,
  baseLrs: readonly number[] | null,
): TorchOptimizerFile {
  const kind = torchKindOf(s) as TorchOptimizerKind;
  if (!Object.hasOwn(HYPER_NAMES, kind)) {
    fail(
      ValueError,
      "saveTrainingState",
      `the optimizer ${quoted(String(s.kind))} is not SGD, Adam or AdamW.`,
    );
  }
  const renamed = Object.entries(HYPER_NAMES[kind]);
  const paramGroups = s.groups.map((g, gi) => ({
    ...Object.fromEntries(renamed.map(([torch, ours]) => [torch, g.hyper[ours]])),
    ...FIXED_OPTIONS[kind],
    ...(baseLrs && { initial_lr: baseLrs[gi] }),
    params: g.params,
  }));
  const state: Record<string, Json> = {};
  const tensors: TorchOptimizerFile["tensors"] = [];
  const compact: TorchOptimizerFile["compact"] = [];
  const plain = dequantizeStates(s);
  for (const [k, p] of plain.state.entries()) {
    const entry: Json = kind === "SGD" ? {} : { step: s.step ?? 0 };
    const saved = s.state[k].buffers;
    if (saved.expAvg !== undefined && !(saved.expAvg instanceof Float32Array)) {
      compact.push(...compactEntries(p.param, p.shape, saved));
    }
    for (const [ours, data] of Object.entries(p.buffers)) {
      tensors.push({
        name: `optimizer.state.${p.param}.${BUFFER_NAMES[ours]}`,
        shape: p.shape,
        data: data as Float32Array,
      });
    }
    // PyTorch's SGD without momentum keeps `momentum_buffer: None`.
    if (kind === "SGD" && !("momentumBuffer" in p.buffers)) entry.momentum_buffer = null;
    state[p.param] = entry;
  }
  const halfstep = kind === "SGD" ? {} : {
    bias_correction: s.settings.biasCorrection,
    ...(s.stateDtype && { state_dtype: s.stateDtype }),
    ...(s.min8bitSize !== undefined && { min_8bit_size: s.min8bitSize }),
  };
  return { metadata: { kind, state, param_groups: paramGroups, halfstep }, tensors, compact };
}

/**
 * The halfstep optimizer state a PyTorch-vocabulary description holds, with
 * its buffers read from the `optimizer.state.<i>.<key>` tensors (each added
 * to `used`). `shapes` are the live optimizer's parameters'; a parameter
 * PyTorch keeps no state for (it never had a gradient) starts from zeros.
 */
export function optimizerFromTorch(
  json: unknown,
  file: { entries: Map<string, SafetensorsEntry>; used: Set<string> },
  live: { kind: TorchOptimizerKind | null; shapes: readonly (readonly number[])[] },
  reject: Reject,
): OptimizerStateDict {
  const o = json as { kind: unknown; state: unknown; param_groups: unknown; halfstep?: Json };
  if (!isObject(o) || !isObject(o.state) || !Array.isArray(o.param_groups)) {
    reject("its optimizer metadata is not an optimizer state_dict (state, param_groups)");
  }
  const kind = o.kind as TorchOptimizerKind;
  if (!Object.hasOwn(HYPER_NAMES, kind)) {
    reject(`its optimizer is ${quoted(String(o.kind))}, not one halfstep has (Adam, AdamW, SGD)`);
  }
  if (live.kind !== null && live.kind !== kind) {
    reject(`it holds the state of ${kind}, the optimizer given is ${live.kind}`);
  }
  const groups = o.param_groups.map((g, gi) => groupFromTorch(kind, g, gi, reject));
  const momentum = new Map<number, boolean>();
  for (const g of groups) for (const i of g.params) momentum.set(i, Number(g.hyper.momentum) > 0);
  const wanted = (i: number) =>
    kind === "SGD" ? (momentum.get(i) ? ["momentumBuffer"] : []) : ["expAvg", "expAvgSq"];
  const steps: unknown[] = [];
  const stateDtype = o.halfstep?.state_dtype;
  const state = live.shapes.map((shape, i) => {
    if (kind !== "SGD" && (stateDtype === "8bit" || stateDtype === "bf16")) {
      const exact = compactFromFile(i, shape, stateDtype, file, reject);
      if (exact) {
        const saved = (o.state as Record<string, unknown>)[String(i)];
        if (isObject(saved)) steps.push(saved.step);
        // The dequantized copies are for PyTorch; the exact form is what resumes.
        for (const key of ["exp_avg", "exp_avg_sq"]) file.used.add(`optimizer.state.${i}.${key}`);
        return { param: i, shape: [...shape], buffers: exact };
      }
    }
    const saved = (o.state as Record<string, unknown>)[String(i)];
    if (saved !== undefined && !isObject(saved)) reject(`its optimizer state ${i} is malformed`);
    if (saved && kind !== "SGD") steps.push(saved.step);
    const buffers = wanted(i).map((ours) => {
      const name = `optimizer.state.${i}.${BUFFER_NAMES[ours]}`, e = file.entries.get(name);
      if (!e) {
        if (saved === undefined || saved[BUFFER_NAMES[ours]] === null) {
          return [ours, new Float32Array(shape.reduce((a, b) => a * b, 1))] as const;
        }
        reject(`the optimizer buffer ${quoted(name)} is missing`);
      }
      if (e.dtype !== "f32" || !sameShape(e.shape, shape)) {
        reject(
          `the optimizer buffer ${quoted(name)} is ${e.dtype} ${shapeString(e.shape)}, ` +
            `not f32 ${shapeString(shape)}`,
        );
      }
      file.used.add(name);
      return [ours, new Float32Array(e.data.slice().buffer)] as const;
    });
    return { param: i, shape: [...shape], buffers: Object.fromEntries(buffers) };
  });
  const bias = o.halfstep?.bias_correction ?? true;
  const settings: Record<string, boolean> = kind === "SGD"
    ? {}
    : { biasCorrection: bias as boolean, decoupledWeightDecay: kind === "AdamW" };
  const compact = kind === "SGD" || stateDtype === undefined ? {} : {
    stateDtype: stateDtype as string,
    ...(o.halfstep?.min_8bit_size !== undefined && {
      min8bitSize: o.halfstep.min_8bit_size as number,
    }),
  };
  return {
    kind: kind === "SGD" ? "SGD" : "Adam",
    settings,
    ...(kind !== "SGD" && { step: oneStep(steps, live.shapes.length, reject) }),
    ...compact,
    groups,
    state,
  };
}

/**
 * Parameter i's compact moments under {@link COMPACT_PREFIX} (null when the
 * file holds none for it: it kept f32 moments), each checked for its dtype
 * and shape (see `compactEntries`) and added to `file.used`.
 */
function compactFromFile(
  i: number,
  shape: readonly number[],
  stateDtype: "8bit" | "bf16",
  file: { entries: Map<string, SafetensorsEntry>; used: Set<string> },
  reject: Reject,
): Record<string, StateBuffer> | null {
  const n = shape.reduce((a, b) => a * b, 1);
  // Scales: any vector here; checkStateDict names a wrong count.
  const want: [string, SafetensorsEntry["dtype"], readonly number[] | null][] =
    stateDtype === "bf16" ? [["expAvg", "bf16", shape], ["expAvgSq", "bf16", shape]] : [
      ["expAvg", "i32", [Math.ceil(n / 4)]],
      ["expAvgSq", "i32", [Math.ceil(n / 4)]],
      ["expAvgAbsmax", "f32", null],
      ["expAvgSqAbsmax", "f32", null],
    ];
  if (!file.entries.has(`${COMPACT_PREFIX}${i}.exp_avg`)) return null;
  const out: Record<string, StateBuffer> = {};
  for (const [ours, dtype, wantShape] of want) {
    const name = `${COMPACT_PREFIX}${i}.${COMPACT_NAMES[ours]}`, e = file.entries.get(name);
    if (!e) reject(`the optimizer buffer ${quoted(name)} is missing`);
    const shapeOk = wantShape ? sameShape(e.shape, wantShape) : e.shape.length === 1;
    if (e.dtype !== dtype || !shapeOk) {
      reject(
        `the optimizer buffer ${quoted(name)} is ${e.dtype} ${shapeString(e.shape)}, ` +
          `not ${dtype} ${wantShape ? shapeString(wantShape) : "[blocks]"}`,
      );
    }
    file.used.add(name);
    const bytes = e.data.slice();
    out[ours] = dtype === "f32"
      ? new Float32Array(bytes.buffer)
      : dtype === "bf16"
      ? new Uint16Array(bytes.buffer)
      : bytes.subarray(0, n);
  }
  return out;
}

/** A PyTorch parameter group as halfstep's: renamed, and what halfstep cannot honour refused. */
function groupFromTorch(
  kind: TorchOptimizerKind,
  g: unknown,
  gi: number,
  reject: Reject,
): OptimizerStateDict["groups"][number] {
  if (!isObject(g)) reject(`its optimizer group ${gi} is not an object`);
  if (!Array.isArray(g.params) || !g.params.every(Number.isSafeInteger)) {
    reject(`its optimizer group ${gi}'s params are not a list of parameter indices`);
  }
  const hyper: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(g)) {
    if (Object.hasOwn(HYPER_NAMES[kind], key)) hyper[HYPER_NAMES[kind][key]] = value;
    else if (key === "params" || HOW_TO_RUN.includes(key)) continue;
    // Newer PyTorch makes AdamW an Adam with `decoupled_weight_decay: true`: it must match the kind.
    else if (key === "decoupled_weight_decay" && value === (kind === "AdamW")) continue;
    else if (value !== false && value !== 0 && value !== null) {
      reject(
        `its optimizer group ${gi} has ${quoted(key)} = ${quoted(JSON.stringify(value))}, ` +
          `which halfstep's ${kind} does not implement`,
      );
    }
  }
  return { params: g.params as number[], hyper: hyper as Record<string, number> };
}

/**
 * The one step count of an Adam state: PyTorch keeps one per parameter,
 * halfstep one for all, so they must agree (a parameter without state only
 * while no step was taken).
 */
function oneStep(steps: unknown[], params: number, reject: Reject): number {
  const step = steps[0] ?? 0;
  if (steps.some((s) => s !== step)) {
    reject("its parameters' step counts differ; halfstep's Adam keeps one step for all");
  }
  if (!Number.isSafeInteger(step) || (step as number) < 0) {
    reject(`its optimizer step must be an integer >= 0, not ${quoted(String(step))}`);
  }
  if (step !== 0 && steps.length < params) {
    reject(`${params - steps.length} parameter(s) have no optimizer state after step ${step}`);
  }
  return step as number;
}

/** `GradScaler.state_dict()` (nothing when disabled, as PyTorch's), halfstep's fields under `halfstep`. */
export function scalerToTorch(s: GradScalerState): Json {
  const o = s.options;
  const halfstep = {
    enabled: o.enabled,
    init_scale: o.initScale,
    hysteresis: o.hysteresis,
    hysteresis_left: s.hysteresisLeft,
    skipped_steps: s.skippedSteps,
    min_scale: o.minScale,
    max_scale: o.maxScale,
    loss_scale: o.lossScale,
  };
  if (!o.enabled) return { halfstep };
  return {
    scale: s.scale,
    growth_factor: o.growthFactor,
    backoff_factor: o.backoffFactor,
    growth_interval: o.growthInterval,
    _growth_tracker: s.growthTracker,
    halfstep,
  };
}

/**
 * The scaler state a `GradScaler.state_dict()` holds; halfstep's fields it
 * lacks (PyTorch wrote it) come from `live`, the options of the scaler given.
 */
export function scalerFromTorch(
  json: unknown,
  live: GradScalerState["options"],
  reject: Reject,
): GradScalerState {
  if (!isObject(json)) reject("its scaler metadata is not an object");
  const x = isObject(json.halfstep) ? json.halfstep : {};
  const enabled = x.enabled ?? "scale" in json;
  const options = {
    initScale: x.init_scale ?? live.initScale,
    growthFactor: json.growth_factor ?? live.growthFactor,
    backoffFactor: json.backoff_factor ?? live.backoffFactor,
    growthInterval: json.growth_interval ?? live.growthInterval,
    hysteresis: x.hysteresis ?? live.hysteresis,
    minScale: x.min_scale ?? live.minScale,
    maxScale: x.max_scale ?? live.maxScale,
    lossScale: x.loss_scale ?? live.lossScale,
    enabled,
  } as GradScalerState["options"];
  return {
    scale: (json.scale ?? 1) as number,
    growthTracker: (json._growth_tracker ?? 0) as number,
    hysteresisLeft: (x.hysteresis_left ?? options.hysteresis) as number,
    skippedSteps: (x.skipped_steps ?? 0) as number,
    options,
  };
}

/** The trainer's own counters (its scaler is saved apart, as PyTorch's). */
export function trainerToTorch(s: AmpTrainerState): Json {
  return { micro_step: s.microStep, steps: s.steps, dtype: s.dtype ?? null };
}

/** A trainer state from its counters and its scaler's state. */
export function trainerFromTorch(
  json: unknown,
  scaler: GradScalerState,
  reject: Reject,
): AmpTrainerState {
  if (!isObject(json)) reject("its trainer metadata is not an object");
  const state: AmpTrainerState = {
    scaler,
    microStep: json.micro_step as number,
    steps: json.steps as number,
  };
  if (json.dtype !== undefined && json.dtype !== null) state.dtype = json.dtype as TrainerPrecision;
  return state;
}

/**
 * The scheduler as `LambdaLR.state_dict()` (the schedule is a function, so
 * `lr_lambdas` is null): `last_epoch` is the step, `_last_lr` the current
 * learning rates; `halfstep.schedule` says which schedule it is.
 */
export function schedulerToTorch(s: LrSchedulerState, lrs: readonly number[]): Json {
  const { schedule } = s;
  return {
    base_lrs: s.baseLrs,
    last_epoch: s.step,
    verbose: false,
    _step_count: s.step + 1,
    _get_lr_called_within_step: false,
    _last_lr: lrs,
    lr_lambdas: s.baseLrs.map(() => null),
    halfstep: schedule
      ? {
        schedule: {
          name: schedule.name,
          warmup_steps: schedule.warmupSteps,
          total_steps: schedule.totalSteps,
          min_factor: schedule.minFactor,
        },
      }
      : {},
  };
}

/** The scheduler state a `LambdaLR.state_dict()` holds (checked by `checkStateDict`). */
export function schedulerFromTorch(json: unknown, reject: Reject): LrSchedulerState {
  if (!isObject(json)) reject("its scheduler metadata is not an object");
  return { baseLrs: json.base_lrs as number[], step: json.last_epoch as number };
}

function isObject(x: unknown): x is Json {
  return typeof x === "object" && x !== null && !Array.isArray(x);
}
