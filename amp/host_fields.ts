/**
 * The host settings a captured training step was recorded under, to tell
 * before each replay whether the model would now run differently: every
 * module's own fields that hold plain values (`training`, a dropout `p`,
 * BatchNorm's `momentum`) and its settable accessors (`Sequential`'s
 * `checkpoint`), how many parameters, buffers and children were registered
 * on it, and whether each parameter still requires a gradient. Checking is
 * one comparison per field: no module walk, no allocation.
 */
import type { Tensor } from "../gpu/mod.ts";
import type { Module } from "../nn/module.ts";
import type { HasParameters } from "./has_parameters.ts";

/** A snapshot of a model's host settings; see the module comment. */
export interface HostFields {
  /** What changed since the snapshot, in words (the first change), or null. */
  changed(): string | null;
}

interface Field {
  readonly owner: Record<string, unknown>;
  readonly key: string;
  readonly where: string;
  /** The value as recorded (JSON text when `json`). */
  readonly value: unknown;
  readonly json: boolean;
}

const isPlain = (v: unknown) =>
  v === null || v === undefined || typeof v === "number" || typeof v === "boolean" ||
  typeof v === "string";

/** Plain data (an object literal or array of plain values), compared as JSON; not a tensor or a module. */
const isData = (v: unknown): boolean =>
  Array.isArray(v) ? v.every(isPlain) : typeof v === "object" && v !== null &&
    Object.getPrototypeOf(v) === Object.prototype && Object.values(v).every(isPlain);

/** `model`'s host settings now, and those of `params` (see the module comment). */
export function hostFields(model: HasParameters, params: readonly Tensor[]): HostFields {
  const modules: [string, object][] = isModule(model) ? model.namedModules() : [["", model]];
  const fields: Field[] = [];
  // Registrations first: a layer added shows as that, not as the field that now holds it.
  for (const [path, m] of modules) {
    const owner = m as Record<string, unknown>;
    const where = path ? `${path}.` : "the model's ";
    if ("registrations" in owner) {
      fields.push({ owner, key: "registrations", where, value: owner.registrations, json: false });
    }
  }
  for (const [path, m] of modules) {
    const owner = m as Record<string, unknown>;
    const where = path ? `${path}.` : "the model's ";
    for (const key of Object.keys(owner)) {
      if (isPlain(owner[key])) fields.push({ owner, key, where, value: owner[key], json: false });
    }
    for (
      let p = Object.getPrototypeOf(m);
      p && p !== Object.prototype;
      p = Object.getPrototypeOf(p)
    ) {
      for (const [key, d] of Object.entries(Object.getOwnPropertyDescriptors(p))) {
        if (!d.get || !d.set) continue;
        const v = owner[key];
        if (!isPlain(v) && !isData(v)) continue; // a tensor, a module: not a setting
        const json = !isPlain(v);
        fields.push({ owner, key, where, value: json ? JSON.stringify(v) : v, json });
      }
    }
  }
  const names = isModule(model)
    ? new Map(model.namedParameters().map(([name, t]) => [t, name]))
    : new Map<Tensor, string>();
  const requires = params.map((p) => p.requiresGrad);
  return {
    changed(): string | null {
      for (const f of fields) {
        const now = f.json ? JSON.stringify(f.owner[f.key]) : f.owner[f.key];
        if (now === f.value) continue;
        if (f.key === "registrations") {
          const on = f.where === "the model's " ? "the model" : f.where.slice(0, -1);
          return `a parameter, buffer or module was registered on ${on}`;
        }
        return `${f.where}${f.key} is ${shown(now)}, the step was captured with ${shown(f.value)}`;
      }
      for (let i = 0; i < params.length; i++) {
        if (params[i].requiresGrad !== requires[i]) {
          const name = names.get(params[i]) ?? `${i} (${params[i].describe()})`;
          return `parameter ${name} was ${requires[i] ? "frozen" : "unfrozen"}`;
        }
      }
      return null;
    },
  };
}

/** A value in a message: plain values as they are, an object by its class. */
function shown(v: unknown): string {
  if (typeof v !== "object" || v === null) return String(v);
  return `a${/^[AEIOU]/.test(v.constructor.name) ? "n" : ""} ${v.constructor.name}`;
}

function isModule(model: HasParameters): model is HasParameters & Module {
  const m = model as Partial<Module>;
  return typeof m.namedModules === "function" && typeof m.namedParameters === "function";
}
