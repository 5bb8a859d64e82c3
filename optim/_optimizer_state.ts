/**
 * Optimizer state dicts as plain data, and their all-or-nothing validation.
 * @internal
 */
import { quoted, sameShape, shapeString, type Tensor } from "../gpu/mod.ts";

/** A hyper-parameter value as groups and state dicts hold it. */
export type HyperValue = number | boolean | readonly number[];

/**
 * How an optimizer state buffer stores its values: f32, bytes (8-bit
 * codes: each an index into a 256-value map) or bf16 bits.
 */
export type StateFormat = "f32" | "u8" | "bf16";

/** One state buffer of a parameter: how it stores its values and how many it has. */
export interface StateSpec {
  /** Storage of each value. */
  format: StateFormat;
  /** Values (elements of the parameter, or blocks for a scale). */
  length: number;
}

/** A state buffer's values as a state dict holds them: f32 values, 8-bit codes or bf16 bits. */
export type StateBuffer = Float32Array | Uint8Array | Uint16Array;

/** The typed array that holds values of `format`. */
const ARRAY_OF: Readonly<Record<StateFormat, string>> = {
  f32: "Float32Array",
  u8: "Uint8Array",
  bf16: "Uint16Array",
};

/** u32 words the GPU keeps for `spec`: 8-bit codes and bf16 bits fill whole quads of elements. */
export function stateWords(spec: StateSpec): number {
  const quads = Math.ceil(spec.length / 4);
  return spec.format === "f32" ? spec.length : spec.format === "u8" ? quads : 2 * quads;
}

/** An optimizer's state as plain data (see `stateDict()`); parameters are named by their index in `params`. */
export interface OptimizerStateDict {
  /** The optimizer class: "SGD" or "Adam" (files from halfstep 0.1 say "FusedSGD", "FusedAdam"). */
  kind: string;
  /** Optimizer-wide switches (Adam: biasCorrection, decoupledWeightDecay); must match on load. */
  settings: Record<string, boolean>;
  /** Adam: the number of steps taken that were not skipped (Adam's t). */
  step?: number;
  /** Adam: how m and v are stored, when not "f32" (see `AdamOptions.stateDtype`). */
  stateDtype?: string;
  /** Adam with 8-bit states: tensors below this many elements keep f32 states. */
  min8bitSize?: number;
  /** Per group: the indices of its parameters and its hyper-parameters (restored on load). */
  groups: { params: number[]; hyper: Record<string, HyperValue> }[];
  /**
   * Per parameter, in `params` order: its shape and state buffers by name
   * (f32 values; Adam's 8-bit states: codes as bytes and f32 block scales;
   * bf16 states: their bits).
   */
  state: { param: number; shape: number[]; buffers: Record<string, StateBuffer> }[];
}

/** Kinds written by halfstep 0.1, before the optimizers lost their "Fused" prefix. */
const LEGACY_KINDS: Readonly<Record<string, string>> = { FusedSGD: "SGD", FusedAdam: "Adam" };

/** Validation message helpers. */
export const need = {
  nonNegative: (v: unknown): boolean => typeof v === "number" && Number.isFinite(v) && v >= 0,
  unit: (v: unknown): boolean => typeof v === "number" && v >= 0 && v < 1,
};

/** What {@link stateDictErrors} checks a state dict against. */
export interface StateOwner {
  kind: string;
  settings: Record<string, boolean>;
  params: readonly Tensor[];
  groups: readonly { readonly params: readonly Tensor[] }[];
  checkHyper(hyper: Record<string, unknown>): string[];
  /** The state buffers parameter `param` of a group with `hyper` carries. */
  stateSpecs(hyper: Record<string, unknown>, param: Tensor): Record<string, StateSpec>;
  /** Problems with the optimizer's own counters (Adam's step). */
  checkExtra(state: OptimizerStateDict): string[];
  /** Buffers whose values can never be negative (Adam's second moments). */
  nonNegative: readonly string[];
  /** Accept NaN / ±Inf values (a diverged run loaded on purpose). */
  allowNonFinite?: boolean;
}

/** Every way `s` does not fit `me`, each a short phrase (empty: it fits). */
export function stateDictErrors(s: OptimizerStateDict, me: StateOwner): string[] {
  if (typeof s !== "object" || s === null) return ["it is not an object"];
  if (s.kind !== me.kind && LEGACY_KINDS[s.kind] !== me.kind) {
    // Another optimizer's state: its settings, hyper-parameters and buffers differ too; say the cause.
    const kind = typeof s.kind === "string" ? quoted(s.kind) : typeof s.kind;
    return [`it is the state of ${kind}, this optimizer is "${me.kind}"`];
  }
  const errors = me.checkExtra(s);
  const settings = me.settings;
  for (const key of new Set([...Object.keys(settings), ...Object.keys(s.settings ?? {})])) {
    if (s.settings?.[key] !== settings[key]) {
      errors.push(`setting ${key} is ${s.settings?.[key]}, this optimizer has ${settings[key]}`);
    }
  }
  if (!Array.isArray(s.groups) || s.groups.length !== me.groups.length) {
    errors.push(`${s.groups?.length ?? "no"} groups, expected ${me.groups.length}`);
    return errors;
  }
  const index = new Map(me.params.map((p, i) => [p, i]));
  const specs: Record<string, StateSpec>[] = [];
  s.groups.forEach((g, gi) => {
    const want = me.groups[gi].params.map((p) => index.get(p));
    if (!Array.isArray(g?.params) || g.params.join() !== want.join()) {
      errors.push(`group ${gi} holds parameters [${g?.params}], expected [${want}]`);
    }
    const defaults = Object.keys(me.groups[gi]).filter((k) => k !== "params");
    const hyper = g?.hyper ?? {};
    unknownKeys(hyper, defaults, `group ${gi}: `, errors);
    const missing = defaults.filter((k) => !(k in hyper));
    if (missing.length) errors.push(`group ${gi} lacks ${missing.join(", ")}`);
    const problems = missing.length ? [] : me.checkHyper(hyper);
    errors.push(...problems.map((e) => `group ${gi}: ${e}`));
    // The buffers each parameter must carry follow the loaded hyper-parameters.
    const from = missing.length ? { ...me.groups[gi] } : hyper;
    for (const p of me.groups[gi].params) specs.push(me.stateSpecs(from, p));
  });
  if (!Array.isArray(s.state) || s.state.length !== me.params.length) {
    errors.push(`${s.state?.length ?? "no"} parameter states, expected ${me.params.length}`);
    return errors;
  }
  s.state.forEach((entry, i) => {
    const p = me.params[i];
    const what = `parameter ${i} (${p.describe()})`;
    if (entry?.param !== i) errors.push(`state entry ${i} is for parameter ${entry?.param}`);
    if (!Array.isArray(entry?.shape) || !sameShape(entry.shape, p.shape)) {
      errors.push(`${what}: saved shape ${shapeString(entry?.shape ?? [])}`);
      return;
    }
    const bufs = entry.buffers ?? {};
    const names = Object.keys(specs[i]);
    if (!sameKeys(bufs, names)) {
      errors.push(`${what}: buffers [${Object.keys(bufs)}], expected [${names}]`);
    }
    for (const [n, data] of Object.entries(bufs)) {
      const spec = specs[i][n];
      if (!spec) continue;
      if (!isFormat(data, spec.format) || data.length !== spec.length) {
        errors.push(
          `${what}: buffer ${n} must be a ${ARRAY_OF[spec.format]} of ${spec.length} values, ` +
            `got ${describeArray(data)}`,
        );
      } else if (spec.format !== "u8") {
        const values = spec.format === "f32"
          ? data as Float32Array
          : bf16Values(data as Uint16Array);
        const problem = valueProblem(values, me.nonNegative.includes(n), me.allowNonFinite);
        if (problem) errors.push(`${what}: buffer ${n} holds ${problem}`);
      }
    }
  });
  return errors;
}

/** Whether `data` is the typed array of `format`. */
function isFormat(data: unknown, format: StateFormat): boolean {
  return format === "f32"
    ? data instanceof Float32Array
    : format === "u8"
    ? data instanceof Uint8Array
    : data instanceof Uint16Array;
}

/** "a Float32Array of 3 values", or what else `data` is. */
function describeArray(data: unknown): string {
  if (ArrayBuffer.isView(data)) {
    return `a ${data.constructor.name} of ${(data as Float32Array).length} values`;
  }
  return data === null ? "null" : typeof data;
}

/** bf16 bits widened to f32 (exact), for the value checks. */
function bf16Values(bits: Uint16Array): Float32Array {
  const words = new Uint32Array(bits.length);
  for (let i = 0; i < bits.length; i++) words[i] = bits[i] << 16;
  return new Float32Array(words.buffer);
}

/**
 * What is wrong with a state buffer's values ("3 negative value(s)"), or
 * null. A negative second moment would turn the weights to NaN at the next
 * step (its square root), so it is refused like NaN and ±Inf.
 */
function valueProblem(
  data: Float32Array,
  nonNegative: boolean,
  allowNonFinite = false,
): string | null {
  let nonFinite = 0, negative = 0;
  for (const v of data) {
    if (!Number.isFinite(v)) nonFinite++;
    else if (nonNegative && v < 0) negative++;
  }
  if (nonFinite > 0 && !allowNonFinite) return `${nonFinite} non-finite value(s) (NaN or ±Inf)`;
  return negative > 0 ? `${negative} negative value(s), impossible for it` : null;
}

/** True when `record` has exactly the keys `names`. */
export function sameKeys(record: object, names: readonly string[]): boolean {
  const keys = Object.keys(record);
  return keys.length === names.length && names.every((n) => keys.includes(n));
}

/** Adds an error for each key of `obj` not in `known`. */
export function unknownKeys(obj: object, known: string[], where: string, errors: string[]): void {
  for (const key of Object.keys(obj)) {
    if (!known.includes(key)) {
      errors.push(`${where}unknown option ${key} (known: ${known.join(", ")})`);
    }
  }
}

/** The hyper-parameters of a group (every key but `params`), arrays copied. */
export function cloneHyper(g: object): Record<string, HyperValue> {
  const entries = Object.entries(g).filter(([k]) => k !== "params");
  return Object.fromEntries(entries.map(([k, v]) => [k, Array.isArray(v) ? [...v] : v]));
}
