/**
 * The machinery `SGD` and `Adam` share: parameter groups and their
 * validation, per-parameter fp32 state buffers, working copies, the default
 * step signals, and state dicts that load all-or-nothing.
 * @internal
 */
import {
  DTypeError,
  fail,
  noteCaptureCheck,
  sameShape,
  StateError,
  Tensor,
  untracked,
  ValueError,
  zeroGrad,
} from "../gpu/mod.ts";
import type { ParamUpdate, UpdateSignals } from "./kernels/update.ts";
import type { Optimizer, StepSignals, WorkingCopies } from "./optimizer.ts";
import {
  cloneHyper,
  need,
  type OptimizerStateDict,
  sameKeys,
  type StateBuffer,
  stateDictErrors,
  type StateSpec,
  stateWords,
  unknownKeys,
} from "./_optimizer_state.ts";

export type { OptimizerStateDict };

/** One parameter group given to an optimizer: its tensors and the defaults it overrides. */
export interface ParamGroup {
  /** fp32 master parameters of this group. */
  params: readonly Tensor[];
  /** Learning rate of this group (default: the optimizer's). */
  lr?: number;
  /** Weight decay of this group, e.g. 0 for biases and LayerNorm weights (default: the optimizer's). */
  weightDecay?: number;
}

/** A parameter group as the optimizer keeps it; `lr` and `weightDecay` may be changed between steps. */
export interface Group {
  /** The group's parameters. */
  readonly params: readonly Tensor[];
  /** Learning rate; set it between steps (what {@link LrScheduler} does). */
  lr: number;
  /** Weight decay; may be changed between steps. */
  weightDecay: number;
}

/** Problems with the hyper-parameters every group has (lr, weight decay). */
export function commonChecks(h: { lr: number; weightDecay: number }): string[] {
  const errors: string[] = [];
  if (!need.nonNegative(h.lr)) errors.push(`lr must be a finite number >= 0, got ${h.lr}`);
  if (!need.nonNegative(h.weightDecay)) {
    errors.push(`weightDecay must be a finite number >= 0, got ${h.weightDecay}`);
  }
  return errors;
}

/**
 * Throws on option keys `kind` does not know, and on `fused: false`:
 * halfstep's optimizers always run as one fused kernel, so
 * `fused: true` (PyTorch's spelling) is accepted and is the only choice.
 */
export function checkOptionKeys(kind: string, options: object, known: string[]): void {
  const given = (options ?? {}) as Record<string, unknown>;
  const errors = Object.keys(given).filter((k) => !known.includes(k) && k !== "fused").map((k) =>
    `unknown option ${k} (known: ${known}, fused)`
  );
  if ("fused" in given && given.fused !== true && given.fused !== undefined) {
    errors.push(
      `fused must be true (or left out), not ${given.fused}: the update always runs as one ` +
        "fused kernel",
    );
  }
  fail(ValueError, `${kind}: invalid options`, errors);
}

/** The shared half of the fused optimizers. */
export abstract class FusedOptimizer<G extends Group> implements Optimizer {
  /** Every parameter, group by group. */
  readonly params: readonly Tensor[];
  /** The parameter groups with their hyper-parameters. */
  readonly groups: readonly G[];
  #state = new Map<Tensor, Record<string, Tensor>>();
  #copies: WorkingCopies | null = null;
  #constants: { zero: Tensor; one: Tensor } | null = null;
  #disposed = false;

  /** Checks and gathers the groups; subclasses allocate state with {@link allocateState}. */
  constructor(
    protected readonly kind: string,
    params: readonly Tensor[] | readonly ParamGroup[],
    defaults: Omit<G, "params">,
  ) {
    if (!Array.isArray(params)) {
      fail(ValueError, kind, "params must be an array of tensors or of parameter groups.");
    }
    const given = params as readonly (Tensor | ParamGroup)[];
    if (given.length === 0) {
      fail(ValueError, kind, "got an empty parameter list; pass Tensor[] or ParamGroup[].");
    }
    const raw: readonly ParamGroup[] = given.every((x) => x instanceof Tensor)
      ? [{ params: given as Tensor[] }]
      : given as ParamGroup[];
    const errors: string[] = [];
    const seen = new Set<Tensor>();
    this.groups = raw.map((g, gi) => {
      const where = raw.length > 1 ? `group ${gi}: ` : "";
      if (g instanceof Tensor || !Array.isArray(g?.params)) {
        errors.push(`${where}expected { params: Tensor[], ... }; do not mix tensors and groups`);
        return { params: [] } as unknown as G;
      }
      unknownKeys(g, ["params", ...Object.keys(defaults)], where, errors);
      for (const p of g.params) {
        if (!(p instanceof Tensor) || p.disposed) {
          errors.push(`${where}a parameter is not a live Tensor`);
        } else if (p.dtype !== "f32") {
          errors.push(
            `${where}parameter ${p.describe()} is not f32: optimizers update fp32 master weights; ` +
              "keep parameters f32 and let autocast run the ops in f16",
          );
        } else if (seen.has(p)) errors.push(`${where}parameter ${p.describe()} appears twice`);
        seen.add(p);
      }
      const hyper = { ...defaults } as Record<string, unknown>;
      for (const key of Object.keys(defaults)) {
        const v = (g as unknown as Record<string, unknown>)[key];
        if (v !== undefined) hyper[key] = v;
      }
      const group = { params: [...g.params], ...hyper } as unknown as G;
      errors.push(...this.checkHyper(group).map((e) => where + e));
      return group;
    });
    fail(ValueError, `${kind}: invalid options`, errors);
    this.params = this.groups.flatMap((g) => g.params);
  }

  /** Problems with a group's hyper-parameters, each a short sentence. */
  protected abstract checkHyper(group: Omit<G, "params">): string[];
  /** Names of the fp32 state buffers (shaped like the parameter) a parameter of `group` needs. */
  protected abstract stateNames(group: Omit<G, "params">): string[];
  /**
   * The state buffers parameter `p` of `group` carries: by default
   * {@link stateNames}, each f32 shaped like `p` (Adam's compact states differ).
   */
  protected stateSpecs(group: Omit<G, "params">, p: Tensor): Record<string, StateSpec> {
    return Object.fromEntries(
      this.stateNames(group).map((n) => [n, { format: "f32", length: p.size }]),
    );
  }
  /** Dispatches the fused updates of a group's parameters that have gradients. */
  protected abstract update(updates: ParamUpdate[], signals: UpdateSignals, group: G): void;
  /** Optimizer-wide switches (saved in state dicts, must match on load). */
  protected settings(): Record<string, boolean> {
    return {};
  }
  /** Runs before the updates of a step that has work (Adam: advance t). */
  protected beforeUpdates(_foundInf: Tensor): void {}

  /** (Re)allocates zeroed state for every parameter whose buffers do not match its group. */
  protected allocateState(): void {
    untracked(() => {
      for (const group of this.groups) {
        for (const p of group.params) {
          const specs = this.stateSpecs(group, p);
          const old = this.#state.get(p);
          if (old && sameKeys(old, Object.keys(specs))) continue;
          for (const t of Object.values(old ?? {})) t.dispose();
          const fresh = Object.entries(specs).map(([n, spec]) => [n, zerosFor(p, spec)]);
          this.#state.set(p, Object.fromEntries(fresh));
        }
      }
    });
  }

  /**
   * One fused update of every parameter that has a gradient, no readback:
   * a dispatch per group and run of up to 16 parameters of the same
   * gradient dtype (`multiTensorSettings` in gpu/kernels/multi_tensor.ts). With `signals.foundInf` non-zero
   * nothing changes (decided on the GPU); gradients are multiplied by
   * `signals.gradScale`. Throws (before dispatching anything) on a gradient
   * whose shape or dtype is wrong.
   */
  step(signals: StepSignals = {}): void {
    this.live("step");
    fail(ValueError, `${this.kind}.step: invalid hyper-parameters`, this.#groupErrors());
    const foundInf = this.#signal(signals.foundInf, "foundInf");
    const gradScale = this.#signal(signals.gradScale, "gradScale");
    const work = new Map<G, ParamUpdate[]>();
    const errors: string[] = [];
    for (const group of this.groups) {
      const updates: ParamUpdate[] = [];
      for (const p of group.params) {
        const g = p.grad;
        if (!g) continue;
        if (g.disposed || !sameShape(g.shape, p.shape) || g.dtype === "i32") {
          errors.push(
            `the gradient of ${p.describe()} is ${g.disposed ? "disposed" : g.describe()}`,
          );
        } else if ([p, this.#copies?.copyOf(p)].some((t) => t && g.sharesMemoryWith(t))) {
          errors.push(`the gradient of ${p.describe()} shares memory with it or its working copy`);
        }
        updates.push({
          param: p,
          grad: g,
          copy: this.#copies?.copyOf(p),
          state: this.#state.get(p)!,
        });
      }
      if (updates.length > 0) work.set(group, updates);
    }
    fail(
      ValueError,
      `${this.kind}.step: gradients must be live float tensors shaped like their parameter`,
      errors,
    );
    if (work.size === 0) return;
    // A captured step checks the hyper-parameters again before each replay, as this step did.
    noteCaptureCheck(() => {
      fail(ValueError, `${this.kind}.step: invalid hyper-parameters`, this.#groupErrors());
      return null;
    });
    this.beforeUpdates(foundInf);
    for (const [group, updates] of work) this.update(updates, { foundInf, gradScale }, group);
  }

  /** Frees every gradient. */
  zeroGrad(): void {
    zeroGrad(this.params);
  }

  /**
   * Registers working copies (master → f16 or bf16 copy, same shape; f32 is accepted
   * too), replacing any earlier registration (null: none). The optimizer
   * keeps a reference to `copies` (amp's `MasterWeights`), which stays their
   * only owner. Each non-skipped update writes the new master value into its
   * copy; the owner fills the copies initially.
   */
  setWorkingCopies(copies: WorkingCopies | null): void {
    this.live("setWorkingCopies");
    const errors: string[] = [];
    const mine = new Set(this.params);
    for (const master of copies?.masters ?? []) {
      const copy = copies!.copyOf(master);
      if (!mine.has(master)) {
        errors.push(`${master.describe()} is not a parameter of this optimizer`);
      } else if (
        !copy || copy.disposed || copy.dtype === "i32" || !sameShape(copy.shape, master.shape)
      ) {
        errors.push(
          `the copy of ${master.describe()} is ${
            !copy || copy.disposed ? "missing or disposed" : copy.describe()
          }`,
        );
      } else if (copy.sharesMemoryWith(master)) {
        errors.push(`the copy of ${master.describe()} is the master`);
      }
    }
    fail(ValueError, `${this.kind}.setWorkingCopies: invalid working copies`, errors);
    this.#copies = copies;
  }

  /**
   * The optimizer state as plain data: hyper-parameters per group, state
   * buffers per parameter (copied to Float32Arrays; Adam's 8-bit codes to
   * Uint8Arrays, its bf16 states' bits to Uint16Arrays) and counters.
   * **A sync point**: it waits for the GPU (all reads are issued together).
   */
  async stateDict(): Promise<OptimizerStateDict> {
    this.live("stateDict");
    const index = new Map(this.params.map((p, i) => [p, i]));
    const groups = this.groups.map((g) => ({
      params: g.params.map((p) => index.get(p)!),
      hyper: cloneHyper(g),
    }));
    const groupOf = new Map(this.groups.flatMap((g) => g.params.map((p) => [p, g])));
    const pending = this.params.map(async (p, i) => {
      const specs = this.stateSpecs(groupOf.get(p)!, p);
      const entries = Object.entries(this.#state.get(p)!);
      const data = await Promise.all(entries.map(([n, t]) => readState(t, specs[n])));
      const buffers = Object.fromEntries(entries.map(([n], j) => [n, data[j]]));
      return { param: i, shape: [...p.shape], buffers };
    });
    const extra = this.readExtra();
    return {
      kind: this.kind,
      settings: this.settings(),
      ...(await extra),
      groups,
      state: await Promise.all(pending),
    };
  }

  /** Adam: reads its step count. */
  protected readExtra(): Promise<{ step?: number }> {
    return Promise.resolve({});
  }
  /** Adam: checks / loads its step count. */
  protected checkExtra(_state: OptimizerStateDict): string[] {
    return [];
  }
  /** Loads extra state once everything is validated. */
  protected loadExtra(_state: OptimizerStateDict): void {}

  /** `state` in the layout this optimizer keeps, where it can be converted (Adam: f32 moments into compact ones). */
  protected converted(state: OptimizerStateDict): OptimizerStateDict {
    return state;
  }

  /** Buffers whose values cannot be negative (Adam: the second moments). */
  protected nonNegativeState(): readonly string[] {
    return [];
  }

  /**
   * Throws, listing every problem, unless `state` can be loaded into this
   * optimizer: kind, settings, groups by parameter index, shapes, buffer
   * names and lengths, values (finite unless `options.allowNonFinite`;
   * second moments never negative) and counters. Changes nothing, so a
   * caller restoring several objects checks them all before writing any.
   */
  checkStateDict(state: OptimizerStateDict, options: { allowNonFinite?: boolean } = {}): void {
    this.live("loadStateDict");
    state = this.converted(state);
    const errors = stateDictErrors(state, {
      kind: this.kind,
      settings: this.settings(),
      params: this.params,
      groups: this.groups,
      checkHyper: (h) => this.checkHyper(h as Omit<G, "params">),
      stateSpecs: (h, p) => this.stateSpecs(h as Omit<G, "params">, p),
      checkExtra: (s) => this.checkExtra(s),
      nonNegative: this.nonNegativeState(),
      allowNonFinite: options.allowNonFinite,
    });
    fail(
      ValueError,
      `${this.kind}.loadStateDict: the state dict does not match this optimizer; nothing was loaded`,
      errors,
    );
  }

  /**
   * Restores a {@link stateDict} result: hyper-parameters, state buffers and
   * counters. Everything is checked first ({@link checkStateDict}); on any
   * mismatch one error lists them all and nothing changes.
   */
  loadStateDict(state: OptimizerStateDict, options: { allowNonFinite?: boolean } = {}): void {
    this.checkStateDict(state, options);
    state = this.converted(state);
    state.groups.forEach((g, gi) => Object.assign(this.groups[gi], cloneHyper(g.hyper)));
    this.allocateState();
    state.state.forEach((s, i) => {
      const bufs = this.#state.get(this.params[i])!;
      for (const [n, data] of Object.entries(s.buffers)) {
        bufs[n].writeBytes(stateBytes(bufs[n], data));
      }
    });
    this.loadExtra(state);
  }

  /** Frees the optimizer state (not the parameters); the optimizer cannot be used afterwards. */
  dispose(): void {
    for (const bufs of this.#state.values()) for (const t of Object.values(bufs)) t.dispose();
    this.#state.clear();
    this.#constants?.zero.dispose();
    this.#constants?.one.dispose();
    this.#disposed = true;
  }

  /** Throws when used after dispose(). */
  protected live(what: string): void {
    if (this.#disposed) fail(StateError, `${this.kind}.${what}`, "the optimizer was disposed.");
  }

  #groupErrors(): string[] {
    return this.groups.flatMap((g, gi) => this.checkHyper(g).map((e) => `group ${gi}: ${e}`));
  }

  #signal(t: Tensor | undefined, name: "foundInf" | "gradScale"): Tensor {
    if (t === undefined) {
      const gpu = this.params[0].gpu;
      this.#constants ??= untracked(() => ({
        zero: Tensor.zeros([1], { gpu }),
        one: Tensor.full([1], 1, { gpu }),
      }));
      return name === "foundInf" ? this.#constants.zero : this.#constants.one;
    }
    if (t.disposed || t.dtype !== "f32" || t.size !== 1) {
      fail(
        DTypeError,
        `${this.kind}.step`,
        `signals.${name} must be a live f32 tensor of one element, got ` +
          `${t.disposed ? "a disposed tensor" : t.describe()}.`,
      );
    }
    return t;
  }
}

/** A zeroed state buffer for `spec`: f32 shaped like `p` (or a vector), codes and bf16 bits in u32 words. */
function zerosFor(p: Tensor, spec: StateSpec): Tensor {
  const gpu = p.gpu;
  if (spec.format === "f32") {
    return Tensor.zeros(spec.length === p.size ? p.shape : [spec.length], { gpu });
  }
  // An i32 tensor holds the words; the kernels bind it as u32.
  return Tensor.zeros([stateWords(spec)], { dtype: "i32", gpu });
}

/** A state buffer's values as a state dict holds them (the padding of the last word dropped). */
async function readState(t: Tensor, spec: StateSpec): Promise<StateBuffer> {
  if (spec.format === "f32") return await t.read() as Float32Array;
  const bytes = await t.gpu.readBuffer(t.buffer, t.size * 4);
  return spec.format === "u8"
    ? new Uint8Array(bytes, 0, spec.length).slice()
    : new Uint16Array(bytes, 0, spec.length).slice();
}

/** The bytes of state buffer `t` holding `data`, zero-padded to its whole words. */
function stateBytes(t: Tensor, data: StateBuffer): Uint8Array {
  const given = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (given.byteLength === t.size * 4) return given;
  const padded = new Uint8Array(t.size * 4);
  padded.set(given);
  return padded;
}
