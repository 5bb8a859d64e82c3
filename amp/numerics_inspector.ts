/**
 * The numerics inspector: which layer overflows, which gradients underflow,
 * which op first broke a step. While attached (`watch(fn)`, or an
 * `AmpTrainer`'s `inspector` option), every op's output in forward and every
 * gradient a backward rule produces gets one small statistics kernel that
 * adds into a GPU buffer (`amp/kernels/numerics_stats.ts`); nothing is read
 * back until `report()`. It sees ops through the runtime's one observer seam
 * (the op observer of `gpu/tensor/runtime_state.ts`), and names them by the module that ran them, which it
 * learns by wrapping each submodule's `forward` for the length of a step.
 */
import {
  type DeviceArray,
  type DType,
  fail,
  type Gpu,
  type GradNode,
  type OpName,
  type OpObserver,
  runtime,
  StateError,
  Tensor,
  untracked,
  ValueError,
  withState,
} from "../gpu/mod.ts";
import type { Module } from "../nn/module.ts";
import type { GradScaler } from "./grad_scaler.ts";
import { OpNames } from "./op_names.ts";
import { launchNumericsStatsInto, NONE, statsBuffer } from "./kernels/numerics_stats.ts";
import {
  decodeStats,
  type NumericsPhase,
  type NumericsReport,
  type RowInfo,
} from "./numerics_report.ts";

/** Options of {@link NumericsInspector.report}. */
export interface ReportOptions {
  /** Start counting afresh after this report (default false): per-epoch statistics. */
  reset?: boolean;
}

/** Options of {@link NumericsInspector.watch}. */
export interface WatchOptions {
  /** The scaler whose scale is in force (reported with the first non-finite). */
  scaler?: GradScaler;
}

/** Rows the statistics buffer holds at first (it doubles when full). */
const FIRST_ROWS = 64;

/**
 * Watches the numerics of `model`'s steps: per op and module, forward and
 * backward, the NaN/Inf count, the values beyond f16's range or below its
 * smallest normal, zeros and the largest |x|, and which op first produced a
 * non-finite value, all gathered on the GPU without a sync. Detached, it
 * changes nothing: no dispatch, same bits.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { crossEntropy, initGpu, Linear, NumericsInspector, ReLU, Sequential, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Sequential(new Linear(2, 4, { seed: 1 }), new ReLU(), new Linear(4, 2, { seed: 2 }));
 * const inspector = new NumericsInspector(model);
 * const x = Tensor.from([1, 2, 3, Infinity], [2, 2]); // an Inf in the batch
 * inspector.watch(() => crossEntropy(model.forward(x), [0, 1]).backward());
 * const report = await inspector.report(); // the only read
 * assert.equal(report.firstNonFinite?.name, "0");
 * assert.equal(report.firstNonFinite?.phase, "forward");
 * const fc2Backward = (r: { name: string; op: string; phase: string }) =>
 *   r.name === "2" && r.op === "linear" && r.phase === "backward";
 * assert.ok(report.rows.some(fc2Backward));
 * inspector.dispose();
 * gpu.destroy();
 * ```
 */
export class NumericsInspector {
  /** The model whose submodules name the ops. */
  readonly model: Module;
  #gpu: Gpu | null = null;
  #paramNames = new Map<Tensor, string>();
  #rows: RowInfo[] = [];
  #rowIndex = new Map<string, number>();
  #nodeNames = new WeakMap<GradNode, string>();
  #opCounts = new Map<OpName, Partial<Record<DType, number>>>();
  #stats: DeviceArray | null = null;
  #capacity = 0;
  #noScale: Tensor | null = null;
  #scale: Tensor | null = null;
  #scaler: GradScaler | null = null;
  #seq = 0;
  #steps = 0;
  /** The first step the next report covers. */
  #firstStep = 0;
  #names: OpNames;
  #callsThisStep = new Map<number, number>();
  #active = false;
  #disposed = false;
  #observer: OpObserver;

  /** An inspector for `model` (any `Module`); attach it with {@link watch} or `AmpTrainer`. */
  constructor(model: Module) {
    if (typeof (model as Module | null)?.namedModules !== "function") {
      fail(ValueError, "NumericsInspector", "the model must be a Module (e.g. a Sequential).");
    }
    this.model = model;
    this.#names = new OpNames(model);
    this.#observer = {
      forward: (op, _inputs, output, node) => this.#forward(op, output, node),
      backward: (node, index, grad) => this.#backward(node, index, grad),
    };
  }

  /** Steps watched so far. */
  get steps(): number {
    return this.#steps;
  }

  /**
   * Runs `fn` (synchronous) as one watched step and returns its result: every
   * op it runs, and every gradient of a backward pass inside it, is counted.
   * Records statistics kernels only; no sync.
   */
  watch<T>(fn: () => T, options: WatchOptions = {}): T {
    this.#live("watch");
    if (runtime.opObserver !== null || this.#active) {
      fail(
        StateError,
        "NumericsInspector.watch",
        "another watch is running; watch one step at a time.",
      );
    }
    this.#scaler = options.scaler?.enabled ? options.scaler : null;
    this.#scale = this.#scaler?.scaleTensor ?? null;
    this.#callsThisStep.clear();
    // The model may have changed since the last step: names come from it as it is now.
    this.#paramNames = new Map(this.model.namedParameters().map(([name, t]) => [t, name]));
    this.#active = true;
    let result: T;
    try {
      result = this.#names.during(() => withState({ opObserver: this.#observer }, fn));
    } finally {
      this.#active = false;
      this.#steps++;
    }
    if (typeof (result as { then?: unknown } | null)?.then === "function") {
      fail(
        ValueError,
        "NumericsInspector.watch",
        "fn returned a promise; watch a synchronous step (await outside of it).",
      );
    }
    return result;
  }

  /**
   * Reads the statistics gathered so far (**a sync point**: the one read of
   * the inspector) and returns them. With `reset`, counting starts afresh
   * after this report (rows keep their names; steps keep their numbers).
   */
  async report(options: ReportOptions = {}): Promise<NumericsReport> {
    this.#live("report");
    // Everything is taken now: steps watched while the read is in flight belong to the next report.
    const stats = this.#stats;
    const rows = this.#rows.map((r) => ({ ...r }));
    const ops = [...this.#opCounts].map(([op, calls]) => ({ op, calls: { ...calls } }));
    const steps = this.#steps - this.#firstStep;
    const scaler = this.#scaler;
    if (options.reset) {
      this.#stats = null;
      this.#capacity = 0;
      for (const r of this.#rows) r.calls = r.values = 0;
      this.#opCounts.clear();
      this.#firstStep = this.#steps;
    }
    const raw = stats ? await stats.read() : null;
    if (options.reset) stats?.dispose();
    const lossScale = scaler ? await scaler.getScale() : null;
    return { steps, ...decodeStats(raw, rows), ops, lossScale };
  }

  /** Frees the statistics buffer; the inspector cannot be used afterwards. */
  dispose(): void {
    this.#stats?.dispose();
    this.#noScale?.dispose();
    this.#stats = this.#noScale = null;
    this.#disposed = true;
  }

  #forward(op: OpName, output: Tensor, node: GradNode | null): void {
    if (!this.#active) return; // a checkpoint recomputed after its watch ended
    if (runtime.recomputing) {
      // A checkpointed region runs again in backward: name its nodes, count nothing twice.
      if (node) this.#nodeNames.set(node, this.#names.module ?? op);
      return;
    }
    const name = this.#names.next(op);
    if (node) this.#nodeNames.set(node, name);
    const perDtype = this.#opCounts.get(op) ?? {};
    perDtype[output.dtype] = (perDtype[output.dtype] ?? 0) + 1;
    this.#opCounts.set(op, perDtype);
    this.#count(output, this.#row(name, op, "forward", output.dtype), NONE);
  }

  #backward(node: GradNode, index: number, grad: Tensor): void {
    if (!this.#active) return;
    const name = this.#nodeNames.get(node) ?? `${node.op}:unwatched`;
    const row = this.#row(name, node.op, "backward", grad.dtype);
    // The cast of a working copy widens a gradient already counted as the copy's.
    const param = node.op === "cast" ? undefined : this.#parameterOf(node.inputs[index]);
    this.#count(grad, row, param ? this.#row(param, node.op, "backward", grad.dtype, true) : NONE);
  }

  /** The parameter name of `input`: a parameter, or the working copy of one. */
  #parameterOf(input: Tensor): string | undefined {
    const own = this.#paramNames.get(input);
    if (own !== undefined) return own;
    const cast = input.gradFn;
    return cast?.op === "cast" ? this.#paramNames.get(cast.inputs[0]) : undefined;
  }

  #row(name: string, op: OpName, phase: NumericsPhase, dtype: DType, param = false): number {
    const key = param
      ? `param\u0000${name}\u0000${dtype}`
      : `${name}\u0000${op}\u0000${phase}\u0000${dtype}`;
    let row = this.#rowIndex.get(key);
    if (row === undefined) {
      row = this.#rows.length;
      this.#rows.push({ name, op, phase, dtype, calls: 0, values: 0, param });
      this.#rowIndex.set(key, row);
    }
    return row;
  }

  /** Dispatches the statistics of `t` into `row` (and `paramRow`). */
  #count(t: Tensor, row: number, paramRow: number): void {
    if (t.dtype === "i32" || t.size === 0) return;
    const gpu = t.gpu;
    const stats = this.#statsFor(gpu, Math.max(row, paramRow === NONE ? 0 : paramRow) + 1);
    for (const r of paramRow === NONE ? [row] : [row, paramRow]) {
      this.#rows[r].calls++;
      this.#rows[r].values += t.size;
    }
    const call = this.#callsThisStep.get(row) ?? 0;
    this.#callsThisStep.set(row, call + 1);
    const scale = this.#scale ?? this.#placeholderScale(gpu);
    launchNumericsStatsInto(gpu, t, scale, stats, {
      row,
      paramRow,
      seq: this.#seq++,
      step: this.#steps,
      call,
    });
  }

  /** The statistics buffer, grown (on the GPU, by a copy) to hold `rows` rows. */
  #statsFor(gpu: Gpu, rows: number): DeviceArray {
    if (this.#gpu !== null && this.#gpu !== gpu) {
      fail(ValueError, "NumericsInspector", "the watched tensors live on two devices; watch one.");
    }
    this.#gpu = gpu;
    if (this.#stats && rows <= this.#capacity) return this.#stats;
    let capacity = Math.max(this.#capacity, FIRST_ROWS);
    while (capacity < rows) capacity *= 2;
    const old = this.#stats;
    const fresh = statsBuffer(gpu, capacity, old);
    old?.dispose();
    this.#stats = fresh;
    this.#capacity = capacity;
    return fresh;
  }

  /** An f32 [1] NaN bound as the scale when no scaler is given (reported as null). */
  #placeholderScale(gpu: Gpu): Tensor {
    this.#noScale ??= untracked(() => Tensor.from([NaN], [1], { gpu }));
    return this.#noScale;
  }

  #live(method: string): void {
    if (this.#disposed) {
      fail(
        StateError,
        `NumericsInspector.${method}`,
        "the inspector was disposed; make a new one.",
      );
    }
  }
}
