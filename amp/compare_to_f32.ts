/**
 * Drift from f32: the same step run once under autocast and once in f32,
 * from the same weights, inputs and random state, and every op's output and
 * every parameter gradient compared — Paddle's fp16-vs-fp32 comparison, in
 * one process, without dump files. Ops are named as the numerics inspector
 * names them (`amp/op_names.ts`) and paired by name, op and call index.
 */
import {
  type DType,
  fail,
  type OpName,
  type OpObserver,
  runtime,
  type Tensor,
  tidy,
  untracked,
  ValueError,
  withState,
} from "../gpu/mod.ts";
import type { Module } from "../nn/module.ts";
import type { AmpDType } from "./amp_dtype.ts";
import { autocast } from "./autocast.ts";
import { moduleGenerators } from "./module_generators.ts";
import { OpNames } from "./op_names.ts";
import type { AutocastLists } from "./policy.ts";

/** How far one tensor of the autocast run is from its f32 twin. */
export interface Drift {
  /** ‖amp − f32‖₂ / ‖f32‖₂ in f64 (0 when both are zero; Infinity when only f32's is, or on NaN/Inf). */
  relativeError: number;
  /** max |amp − f32|. */
  maxAbsError: number;
}

/** One op's output drift (see {@link compareToF32}). */
export interface OpDrift extends Drift {
  /** The largest relative error among its inputs (0 for inputs that are the same in both runs). */
  inputError: number;
  /** `relativeError − inputError` (not below 0): the drift the op itself added; ops rank by it. */
  addedError: number;
  /** The module path that ran it, or `op:index` outside submodules. */
  name: string;
  /** The op. */
  op: OpName;
  /** Which call of this op by this module in the step (0 = the first). */
  call: number;
  /** The dtype it wrote under autocast. */
  dtype: DType;
}

/** One parameter's gradient drift. */
export interface ParameterDrift extends Drift {
  /** The parameter's state-dict name. */
  name: string;
}

/** What {@link compareToF32} returns: ops and parameter gradients, largest drift first. */
export interface DriftReport {
  /** Every op that ran in both runs, largest added error first. */
  ops: OpDrift[];
  /** Every parameter that got a gradient in both runs, largest relative error first. */
  params: ParameterDrift[];
}

/** Options of {@link compareToF32}. */
export interface CompareToF32Options {
  /** The autocast lists of the mixed-precision run (default: the standard ones). */
  lists?: AutocastLists;
  /** The dtype of the mixed-precision run: "f16" (default) or "bf16". */
  dtype?: AmpDType;
}

/** What one run kept: op outputs and the keys of each op's inputs, by key; gradients by name. */
interface Run extends Captured {
  grads: Map<string, Tensor>;
}

interface Captured {
  outputs: Map<string, Tensor>;
  inputs: Map<string, string[]>;
}

/**
 * Runs `fn` (which returns the loss, a single value) forward and backward
 * twice — in f32, then under autocast — from the same weights and the same
 * random state of the model's generators, and ranks every op output and
 * parameter gradient by how far the autocast run is from the f32 one. The
 * model's gradients and generators are left as they were. **A sync point**:
 * it reads every output back.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { compareToF32, initGpu, LayerNorm, Linear, mean, scale, Sequential, square, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Sequential(new Linear(4, 8, { seed: 1 }), new LayerNorm(8));
 * const x = Tensor.from([1, 2, 3, 4, 4, 3, 2, 1], [2, 4]);
 * const drift = await compareToF32(model, () => mean(square(model.forward(scale(x, 2)))));
 * const first = drift.ops.find((d) => d.op === "scale")!; // f32 in both runs
 * assert.equal(first.relativeError, 0);
 * gpu.destroy();
 * ```
 */
export async function compareToF32(
  model: Module,
  fn: () => Tensor,
  options: CompareToF32Options = {},
): Promise<DriftReport> {
  if (typeof (model as Module | null)?.namedModules !== "function" || typeof fn !== "function") {
    fail(ValueError, "compareToF32", "call compareToF32(model, () => loss) with a Module.");
  }
  const params = model.namedParameters();
  const gradsBefore = params.map(([, p]) => p.grad);
  const generators = moduleGenerators(model).map(({ generator }) => ({
    generator,
    state: generator.state(),
  }));
  const runOnce = (amp: boolean): Run => {
    for (const { generator, state } of generators) generator.setState(state);
    for (const [, p] of params) p.grad = null;
    const captured = captureOutputs(model, () =>
      tidy(() => {
        const loss = amp
          ? autocast(fn, { lists: options.lists, dtype: options.dtype, gpu: params[0]?.[1].gpu })
          : fn();
        loss.backward();
      }));
    const grads = new Map<string, Tensor>();
    for (const [name, p] of params) if (p.grad) grads.set(name, p.grad);
    return { ...captured, grads };
  };
  let f32: Run | null = null, amp: Run | null = null;
  try {
    f32 = runOnce(false);
    amp = runOnce(true);
    return await compareRuns(f32, amp);
  } finally {
    for (const run of [f32, amp]) {
      for (const t of [...run?.outputs.values() ?? [], ...run?.grads.values() ?? []]) t.dispose();
    }
    params.forEach(([, p], i) => (p.grad = gradsBefore[i]));
    for (const { generator, state } of generators) generator.setState(state);
  }
}

/** Every op output and parameter gradient of `amp` against its twin in `f32`, ranked. */
async function compareRuns(f32: Run, amp: Run): Promise<DriftReport> {
  const drifts = new Map<string, Drift>();
  for (const [key, mixed] of amp.outputs) {
    const reference = f32.outputs.get(key);
    if (reference) drifts.set(key, drift(await mixed.read(), await reference.read()));
  }
  const ops = [...drifts].map(([key, d]): OpDrift => {
    const [name, op, call] = key.split("\u0000");
    const inputError = Math.max(
      0,
      ...inputKeys(amp, key).map((k) => rank(drifts.get(k)?.relativeError ?? 0)),
    );
    const own = rank(d.relativeError);
    const addedError = own > inputError ? own - inputError : 0; // Infinity over Infinity adds 0
    const dtype = amp.outputs.get(key)!.dtype;
    return { name, op: op as OpName, call: Number(call), dtype, ...d, inputError, addedError };
  });
  const paramDrift: ParameterDrift[] = [];
  for (const [name, mixed] of amp.grads) {
    const reference = f32.grads.get(name);
    if (reference) {
      paramDrift.push({ name, ...drift(await mixed.read(), await reference.read()) });
    }
  }
  ops.sort((a, b) => b.addedError - a.addedError || rank(b.relativeError) - rank(a.relativeError));
  paramDrift.sort((a, b) => rank(b.relativeError) - rank(a.relativeError));
  return { ops, params: paramDrift };
}

/**
 * Runs `fn` keeping a handle of every op's float output, keyed by name, op
 * and call, and the keys of each op's inputs that an earlier op produced.
 */
function captureOutputs(model: Module, fn: () => void): Captured {
  const names = new OpNames(model);
  const outputs = new Map<string, Tensor>();
  const inputs = new Map<string, string[]>();
  const keys = new WeakMap<Tensor, string>();
  const calls = new Map<string, number>();
  const observer: OpObserver = {
    forward: (op, given, output) => {
      if (runtime.recomputing) return; // a checkpoint's second run
      const base = `${names.next(op)}\u0000${op}`;
      const call = calls.get(base) ?? 0;
      calls.set(base, call + 1);
      if (output.dtype === "i32") return;
      const key = `${base}\u0000${call}`;
      keys.set(output, key);
      inputs.set(key, given.flatMap((t) => keys.get(t) ?? []));
      outputs.set(key, untracked(() => output.share()));
    },
    backward: () => {},
  };
  try {
    names.during(() => withState({ opObserver: observer }, fn));
  } catch (e) {
    for (const t of outputs.values()) t.dispose();
    throw e;
  }
  return { outputs, inputs };
}

/** The keys of `key`'s inputs, looking through autocast's casts (which have no f32 twin). */
function inputKeys(run: Captured, key: string): string[] {
  return (run.inputs.get(key) ?? []).flatMap((k) =>
    run.outputs.has(k) && k.split("\u0000")[1] === "cast" ? inputKeys(run, k) : [k]
  );
}

/** The drift of `mixed` from `reference`, in f64. */
function drift(mixed: ArrayLike<number>, reference: ArrayLike<number>): Drift {
  let diff = 0, norm = 0, maxAbsError = 0;
  for (let i = 0; i < reference.length; i++) {
    const d = Math.abs(mixed[i] - reference[i]);
    diff += d * d;
    norm += reference[i] * reference[i];
    maxAbsError = Math.max(maxAbsError, Number.isNaN(d) ? Infinity : d);
  }
  const relativeError = diff === 0
    ? 0
    : Number.isFinite(diff) && norm > 0
    ? Math.sqrt(diff / norm)
    : Infinity;
  return { relativeError, maxAbsError };
}

/** NaN ranks with Infinity, first. */
function rank(x: number): number {
  return Number.isNaN(x) ? Infinity : x;
}
