/**
 * Module: the base of every layer. A module owns named parameters (trained
 * tensors), named buffers (state such as running statistics) and named child
 * modules; names join with dots (`layers.0.weight`), as in PyTorch.
 */
import {
  bytesPerElement,
  cut,
  type DType,
  fail,
  type FloatDType,
  quoted,
  sameShape,
  type Shape,
  shapeString,
  Tensor,
  untracked,
  ValueError,
  zeroGrad,
} from "../gpu/mod.ts";
import { bytesOfFloats, floatsOfBytes } from "./host_floats.ts";

/** Tensor data held on the CPU, e.g. read from a safetensors file. */
export interface HostTensor {
  /** Element type of `data`. */
  dtype: DType;
  /** Extents. */
  shape: Shape;
  /** Raw little-endian bytes. */
  data: Uint8Array;
}

/** Options of `Module.loadStateDict` (and of the file loaders built on it). */
export interface LoadStateOptions {
  /** Load host data that holds NaN or ±Inf (default false: a clear error naming the tensor). */
  allowNonFinite?: boolean;
}

/** How many NaN / ±Inf values float host data holds (0 for i32). */
export function nonFiniteCount(t: HostTensor): number {
  if (t.dtype === "i32") return 0;
  const values = floatsOfBytes(t.data, t.dtype);
  let bad = 0;
  for (let i = 0; i < values.length; i++) if (!Number.isFinite(values[i])) bad++;
  return bad;
}

/**
 * `tensor "name" holds N non-finite value(s)` for the first of `named` that
 * holds NaN / ±Inf, with how many more do; null when none does. Savers and
 * loaders append what they did about it.
 */
export function nonFiniteSummary(named: Iterable<readonly [string, HostTensor]>): string | null {
  const bad = [...named].map(([name, t]) => [name, nonFiniteCount(t)] as const)
    .filter(([, n]) => n > 0);
  if (bad.length === 0) return null;
  const [name, count] = bad[0];
  const more = bad.length > 1 ? ` (and ${bad.length - 1} more tensor(s))` : "";
  return `tensor ${quoted(name)} holds ${count} non-finite value(s)${more}`;
}

/** The largest finite value of each float dtype (what a cast beyond it turns into ±Inf). */
const LARGEST_FINITE: Readonly<Record<FloatDType, string>> = {
  f32: "3.4e38",
  f16: "65504",
  bf16: "3.39e38",
};

/** A load error lists at most this many problems (a whole model missing stays readable). */
const MAX_PROBLEMS = 5;

/** What `loadStateDict` accepts for each name: a tensor or host data. */
export type StateValue = Tensor | HostTensor;

/** Base class of layers and models. */
export abstract class Module {
  /** True in training mode (dropout active, BatchNorm uses batch statistics). */
  training = true;
  #parameters = new Map<string, Tensor>();
  #buffers = new Map<string, Tensor>();
  #optionalOnLoad = new Set<string>();
  #children = new Map<string, Module>();
  #registrations = 0;

  /**
   * How many parameters, buffers and children were registered on this
   * module (not its descendants): a captured training step records again
   * when it moves, as its commands may no longer cover the model. @internal
   */
  get registrations(): number {
    return this.#registrations;
  }

  /** Computes the module's output. */
  abstract forward(input: Tensor): Tensor;

  /** Registers a trained tensor under `name`; it gets `requiresGrad`. Returns it. */
  protected registerParameter(name: string, tensor: Tensor): Tensor {
    this.#checkName(name);
    tensor.requiresGrad = true;
    this.#parameters.set(name, tensor);
    this.#registrations++;
    return tensor;
  }

  /**
   * Registers non-trained state (running statistics) under `name`. Returns it.
   * With `optionalOnLoad`, a state dict that lacks it still loads (the buffer
   * keeps its value), as PyTorch does for buffers added in a later version.
   */
  protected registerBuffer(
    name: string,
    tensor: Tensor,
    options: { optionalOnLoad?: boolean } = {},
  ): Tensor {
    this.#checkName(name);
    this.#buffers.set(name, tensor);
    this.#registrations++;
    if (options.optionalOnLoad) this.#optionalOnLoad.add(name);
    return tensor;
  }

  /** Registers a child module under `name`. Returns it. */
  protected registerModule<M extends Module>(name: string, module: M): M {
    this.#checkName(name);
    this.#children.set(name, module);
    this.#registrations++;
    return module;
  }

  /**
   * Parameters of this module and its descendants, with dotted names. A
   * parameter shared by two modules (tied weights) is listed once, under its
   * first name, as PyTorch's `named_parameters()`: an optimizer sees it once.
   */
  namedParameters(): [string, Tensor][] {
    const seen = new Set<Tensor>();
    return this.#collect((m) => m.#parameters).filter(([, t]) => !seen.has(t) && seen.add(t));
  }

  /** Buffers of this module and its descendants, with dotted names. */
  namedBuffers(): [string, Tensor][] {
    return this.#collect((m) => m.#buffers);
  }

  /** Every parameter (what an optimizer updates). */
  parameters(): Tensor[] {
    return this.namedParameters().map(([, t]) => t);
  }

  /**
   * This module (named `""`) and every descendant, with dotted paths as in
   * state dicts (`"blocks.2.fc1"`), parents before their children. A module
   * registered twice is listed once, under its first path.
   */
  namedModules(prefix = ""): [string, Module][] {
    const out: [string, Module][] = [];
    const seen = new Set<Module>();
    const visit = (m: Module, path: string) => {
      if (seen.has(m)) return;
      seen.add(m);
      out.push([path, m]);
      for (const [name, child] of m.#children) visit(child, path ? `${path}.${name}` : name);
    };
    visit(this, prefix);
    return out;
  }

  /** Direct children, in registration order. */
  children(): Module[] {
    return [...this.#children.values()];
  }

  /** Sets training mode here and in every descendant. Returns this. */
  train(mode = true): this {
    this.training = mode;
    for (const child of this.#children.values()) child.train(mode);
    return this;
  }

  /** Evaluation mode: `train(false)`. */
  eval(): this {
    return this.train(false);
  }

  /**
   * Parameters and buffers by dotted name. The tensors are the live ones, not
   * copies. A tied parameter is listed under each of its names (the same
   * tensor), as PyTorch's `state_dict()`; a file saved from it holds the data
   * under both names.
   */
  stateDict(): Map<string, Tensor> {
    return new Map([...this.#collect((m) => m.#parameters), ...this.namedBuffers()]);
  }

  /**
   * Copies `state` into the module's parameters and buffers. Every name,
   * shape and dtype is checked first, and host data (from a file) must hold
   * finite values unless `options.allowNonFinite`; all problems are reported
   * in one error, and nothing is written unless everything passes. The
   * state may hold the module's own tensors (`m.loadStateDict(m.stateDict())`,
   * swapped or shared entries): it loads as if every tensor were copied first.
   * A tied parameter must get the same value under each of its names (equal
   * host data, or one tensor): two different values for one tensor are an
   * error, never a silent last-one-wins.
   */
  loadStateDict(
    state: ReadonlyMap<string, StateValue>,
    options: LoadStateOptions = {},
  ): void {
    const own = this.stateDict();
    state = this.#upgraded(state);
    const problems: string[] = [];
    const optional = new Set(
      this.#collect((m) => {
        const picked = new Map<string, Tensor>();
        for (const name of m.#optionalOnLoad) picked.set(name, m.#buffers.get(name)!);
        return picked;
      }).map(([name]) => name),
    );
    for (const name of own.keys()) {
      if (!state.has(name) && !optional.has(name)) problems.push(`missing ${cut(name)}`);
    }
    for (const name of state.keys()) if (!own.has(name)) problems.push(`unexpected ${cut(name)}`);
    const converted = new Map<string, StateValue>();
    for (const [name, target] of own) {
      let value = state.get(name);
      if (!value) continue;
      const shown = cut(name);
      if (!isHostTensor(value) && value.disposed) {
        problems.push(`${shown}: the source tensor was disposed`);
        continue;
      }
      // Host floats of another type (an f16 or bf16 file into fp32 parameters) are
      // converted, as PyTorch's load_state_dict copies with a cast. Finite values the
      // narrower type cannot hold become ±Inf there: they are counted apart, so the
      // message does not call a finite file "non-finite".
      let overflowed = 0;
      if (
        isHostTensor(value) && value.dtype !== target.dtype && isFloat(value) &&
        target.dtype !== "i32"
      ) {
        const before = nonFiniteCount(value);
        value = convertFloats(value, target.dtype as FloatDType);
        overflowed = nonFiniteCount(value) - before;
      }
      converted.set(name, value);
      if (value.dtype !== target.dtype || !sameShape(value.shape, target.shape)) {
        problems.push(
          `${shown}: expected ${target.describe()}, got ${value.dtype} ` +
            cut(shapeString(value.shape)),
        );
      } else if (
        isHostTensor(value) && value.data.byteLength !== target.size * bytesPerElement(target.dtype)
      ) {
        problems.push(`${shown}: ${value.data.byteLength} bytes do not fill ${target.describe()}`);
      } else if (isHostTensor(value) && !options.allowNonFinite) {
        const bad = nonFiniteCount(value) - overflowed;
        if (overflowed > 0) {
          problems.push(
            `${shown} holds ${overflowed} finite value(s) beyond ${target.dtype}'s range ` +
              `(largest finite ${LARGEST_FINITE[target.dtype as FloatDType]}); load it into ` +
              "f32 or bf16 parameters, or pass { allowNonFinite: true } to load them as ±Inf",
          );
        } else if (bad > 0) {
          problems.push(
            `${shown} holds ${bad} non-finite value(s) (NaN or ±Inf); pass ` +
              "{ allowNonFinite: true } to load it anyway",
          );
        }
      }
    }
    problems.push(...tiedConflicts(own, converted));
    if (problems.length > 0) {
      // One line (logs and CLI errors stay readable), at most MAX_PROBLEMS problems in it.
      const more = problems.length - MAX_PROBLEMS;
      const listed = more > 1 ? [...problems.slice(0, MAX_PROBLEMS), `and ${more} more`] : problems;
      fail(
        ValueError,
        `loadStateDict: the state does not fit this ${this.constructor.name}`,
        `${listed.join("; ")} (nothing was changed).`,
      );
    }
    writeAll(own, converted);
  }

  /**
   * Rewrites, in `state`, the entries an older version of this module saved
   * under other names or layouts into today's (`prefix` is this module's
   * dotted path, e.g. `"blocks.0.attention."`). `loadStateDict` calls it on
   * every module before it checks anything. The default does nothing.
   */
  protected upgradeState(_state: Map<string, StateValue>, _prefix: string): void {}

  /** `state` after every module's {@link upgradeState} (a copy; the caller's map is untouched). */
  #upgraded(state: ReadonlyMap<string, StateValue>): Map<string, StateValue> {
    const copy = new Map(state);
    const visit = (m: Module, prefix: string) => {
      m.upgradeState(copy, prefix);
      for (const [name, child] of m.#children) visit(child, `${prefix}${name}.`);
    };
    visit(this, "");
    return copy;
  }

  /** Frees every parameter's gradient (call after each optimizer step). */
  zeroGrad(): void {
    zeroGrad(this.parameters());
  }

  /** Frees the GPU memory of every parameter, gradient and buffer. */
  dispose(): void {
    this.zeroGrad();
    for (const t of new Set(this.stateDict().values())) t.dispose();
  }

  #collect(pick: (m: Module) => Map<string, Tensor>, prefix = ""): [string, Tensor][] {
    const out: [string, Tensor][] = [];
    for (const [name, t] of pick(this)) out.push([prefix + name, t]);
    for (const [name, child] of this.#children) {
      out.push(...child.#collect(pick, `${prefix}${name}.`));
    }
    return out;
  }

  #checkName(name: string): void {
    if (!name || name.includes(".")) {
      throw new ValueError(`Module: name '${name}' must be non-empty and contain no dot.`);
    }
    if (this.#parameters.has(name) || this.#buffers.has(name) || this.#children.has(name)) {
      throw new ValueError(
        `Module: '${name}' is already registered on this ${this.constructor.name}.`,
      );
    }
  }
}

/**
 * The names of a tied parameter (one tensor under several names) whose
 * values differ: equal host bytes or one source tensor agree; anything else
 * would leave whichever was written last.
 */
function tiedConflicts(own: Map<string, Tensor>, values: Map<string, StateValue>): string[] {
  const firstName = new Map<Tensor, string>();
  const problems: string[] = [];
  for (const [name, target] of own) {
    const first = firstName.get(target);
    if (first === undefined) {
      firstName.set(target, name);
      continue;
    }
    const a = values.get(first), b = values.get(name);
    if (!a || !b || a === b) continue;
    const same = isHostTensor(a) && isHostTensor(b)
      ? sameBytes(a.data, b.data)
      : !isHostTensor(a) && !isHostTensor(b) && a.buffer === b.buffer;
    if (!same) {
      problems.push(
        `${cut(first)} and ${cut(name)} are one tied tensor but get different values ` +
          "(load one value under both names)",
      );
    }
  }
  return problems;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.byteLength !== b.byteLength) return false;
  for (let i = 0; i < a.byteLength; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * Writes every validated value into its destination, as if every GPU source
 * were copied first: a source that is another destination (a swapped or
 * shared state dict of the module's own tensors) is snapshotted before any
 * write, and a source that is its own destination is skipped (a GPU copy
 * cannot read and write one buffer).
 */
function writeAll(own: Map<string, Tensor>, values: Map<string, StateValue>): void {
  const destinations = new Set([...own.values()].map((t) => t.buffer));
  const snapshots = new Map<GPUBuffer, Tensor>();
  for (const [name, target] of own) {
    const value = values.get(name);
    if (!value || isHostTensor(value)) continue;
    const source = value.buffer;
    if (source === target.buffer || !destinations.has(source) || snapshots.has(source)) continue;
    const snapshot = untracked(() => Tensor.empty(value.shape, value.dtype, value.gpu));
    snapshot.copyFrom(value);
    snapshots.set(source, snapshot);
  }
  for (const [name, target] of own) {
    const value = values.get(name);
    if (!value) continue; // an optional buffer the state does not hold
    if (isHostTensor(value)) target.writeBytes(value.data);
    else if (value.buffer !== target.buffer) target.copyFrom(snapshots.get(value.buffer) ?? value);
  }
  for (const snapshot of snapshots.values()) snapshot.dispose();
}

function isFloat(t: HostTensor): t is HostTensor & { dtype: FloatDType } {
  return t.dtype !== "i32";
}

/**
 * Host float data as another float dtype: exact when widening (a bf16 file
 * into f32 parameters), rounding to nearest-even once when narrowing.
 */
function convertFloats(t: HostTensor & { dtype: FloatDType }, dtype: FloatDType): HostTensor {
  return { dtype, shape: t.shape, data: bytesOfFloats(floatsOfBytes(t.data, t.dtype), dtype) };
}

/** True when `value` is host data (from a file), not a GPU tensor. */
export function isHostTensor(value: StateValue): value is HostTensor {
  return (value as HostTensor).data instanceof Uint8Array;
}
