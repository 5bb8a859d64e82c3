/**
 * Loss scaling with PyTorch's GradScaler semantics, decided on the GPU: the
 * scale, the found-inf flag and the counters live in GPU buffers, so
 * scale/unscale/step/update never read back to the CPU.
 */
import {
  checkOptionNames,
  DTypeError,
  fail,
  getGpu,
  type Gpu,
  scaleLoss,
  StateError,
  Tensor,
  untracked,
  ValueError,
  warnOnce,
} from "../gpu/mod.ts";
import {
  COUNTER,
  launchInverseScaleInto,
  launchScaleUpdateInto,
  launchUnscaleInto,
  UPDATE_MODE,
} from "./kernels/grad_scaler.ts";
import type { Optimizer, StepSignals } from "../optim/optimizer.ts";

const F32_MAX = 3.4028234663852886e38;
const F32_MIN_NORMAL = 2 ** -126;

/** Options of {@link GradScaler} (PyTorch's defaults, plus static mode, hysteresis and clamps). */
export interface GradScalerOptions {
  /** Starting scale of dynamic mode (default 2^16; PyTorch's `init_scale`). */
  initScale?: number;
  /** Multiplier after `growthInterval` clean steps in a row, > 1 (default 2; `growth_factor`). */
  growthFactor?: number;
  /** Multiplier on overflow, in (0, 1) (default 0.5; `backoff_factor`). */
  backoffFactor?: number;
  /** Clean steps in a row before growing, a positive integer (default 2000; `growth_interval`). */
  growthInterval?: number;
  /** Overflows tolerated before backing off (DeepSpeed/Megatron; default 1: back off at once). */
  hysteresis?: number;
  /** Floor of the dynamic scale (default 1, as DeepSpeed and Megatron). */
  minScale?: number;
  /** Ceiling of the dynamic scale (default 2^24, as apex); growing never reaches inf anyway. */
  maxScale?: number;
  /** apex's `--loss_scale`: 0 or absent = dynamic, a power of two = static (never changes). */
  lossScale?: number;
  /** False makes every method a pass-through (default true; PyTorch's `enabled`). */
  enabled?: boolean;
  /** The device (default: the one `initGpu()` made). */
  gpu?: Gpu;
}

/** Everything {@link GradScaler.stateDict} saves: plain numbers, JSON-safe. */
export interface GradScalerState {
  /** Current scale. */
  scale: number;
  /** Clean steps since the last growth or overflow. */
  growthTracker: number;
  /** Overflows still tolerated before a backoff. */
  hysteresisLeft: number;
  /** Steps skipped so far. */
  skippedSteps: number;
  /** The options in force (dynamic mode has lossScale 0). */
  options: Required<Omit<GradScalerOptions, "gpu">>;
}

type Settings = GradScalerState["options"];
type Stage = "unscaled" | "stepped";

/** The `where` of an error raised by `method`. */
const at = (method: string) => `GradScaler.${method}`;

/** Every option of {@link GradScalerOptions} (a new one fails the type check until listed). */
const SCALER_OPTIONS: Record<keyof GradScalerOptions, true> = {
  initScale: true,
  growthFactor: true,
  backoffFactor: true,
  growthInterval: true,
  hysteresis: true,
  minScale: true,
  maxScale: true,
  lossScale: true,
  enabled: true,
  gpu: true,
};

/**
 * True when `x` can be a static loss scale: a power of two that is a normal
 * f32 number (2^-126 to 2^127). Powers of two scale and unscale gradients
 * without rounding. (0 means dynamic scaling; see {@link GradScalerOptions}.)
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { isStaticLossScale } from "./grad_scaler.ts";
 * assert.ok(isStaticLossScale(1024));
 * assert.ok(!isStaticLossScale(1000));
 * assert.ok(!isStaticLossScale(0));
 * ```
 */
export function isStaticLossScale(x: unknown): boolean {
  return typeof x === "number" && x >= F32_MIN_NORMAL && x <= F32_MAX &&
    2 ** Math.round(Math.log2(x)) === x;
}

function checkScale(method: string, name: string, x: unknown): number {
  if (typeof x !== "number" || !(x >= F32_MIN_NORMAL && x <= F32_MAX)) {
    fail(
      ValueError,
      at(method),
      `${name} must be a positive finite f32 number (2^-126 to 3.4e38), not ${x}.`,
    );
  }
  return x;
}

function checkCount(method: string, name: string, x: unknown, min: number): number {
  if (typeof x !== "number" || !Number.isInteger(x) || x < min || x >= 2 ** 31) {
    fail(ValueError, at(method), `${name} must be an integer ≥ ${min}, not ${x}.`);
  }
  return x;
}

function settingsOf(method: string, o: Partial<Settings>): Settings {
  const s: Settings = {
    initScale: checkScale(method, "initScale", o.initScale ?? 2 ** 16),
    growthFactor: o.growthFactor ?? 2,
    backoffFactor: o.backoffFactor ?? 0.5,
    growthInterval: checkCount(method, "growthInterval", o.growthInterval ?? 2000, 1),
    hysteresis: checkCount(method, "hysteresis", o.hysteresis ?? 1, 1),
    minScale: checkScale(method, "minScale", o.minScale ?? 1),
    maxScale: checkScale(method, "maxScale", o.maxScale ?? 2 ** 24),
    lossScale: o.lossScale ?? 0,
    enabled: o.enabled ?? true,
  };
  if (typeof s.growthFactor !== "number" || !(s.growthFactor > 1 && s.growthFactor <= F32_MAX)) {
    fail(
      ValueError,
      at(method),
      `growthFactor must be a finite number > 1, not ${s.growthFactor}.`,
    );
  }
  if (typeof s.backoffFactor !== "number" || !(s.backoffFactor > 0 && s.backoffFactor < 1)) {
    fail(ValueError, at(method), `backoffFactor must be in (0, 1), not ${s.backoffFactor}.`);
  }
  if (s.minScale > s.maxScale) {
    fail(ValueError, at(method), `minScale ${s.minScale} > maxScale ${s.maxScale}.`);
  }
  if (s.initScale < s.minScale || s.initScale > s.maxScale) {
    fail(
      ValueError,
      at(method),
      `initScale ${s.initScale} is outside [${s.minScale}, ${s.maxScale}] (min/max).`,
    );
  }
  const ls = s.lossScale;
  if (ls !== 0 && !(checkScale(method, "lossScale", ls) && isStaticLossScale(ls))) {
    fail(
      ValueError,
      at(method),
      `lossScale must be 0 (dynamic) or a power of two (static), not ${ls}.`,
    );
  }
  if (typeof s.enabled !== "boolean") {
    fail(ValueError, at(method), `enabled must be a boolean, not ${s.enabled}.`);
  }
  return s;
}

/**
 * Dynamic (or static) loss scaling for f16 training, PyTorch's `GradScaler`
 * on the GPU. Dynamic rule: back off ×`backoffFactor` on an overflow (after
 * `hysteresis` overflows since the last growth), grow ×`growthFactor` after
 * `growthInterval` clean steps, within [minScale, maxScale] and never to inf.
 * A step whose gradients hold inf/NaN is skipped by the optimizer on the GPU.
 * The state is one f32 [1] scale, the f32 [1] found-inf flag and four u32
 * counters (growth tracker, hysteresis left, skipped steps, last skipped).
 *
 * With several optimizers the found-inf flag is shared: an optimizer stepped
 * after another one's gradients were unscaled sees that one's overflow too.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { crossEntropy, SGD, GradScaler, initGpu, Linear, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Linear(2, 2, { seed: 1 });
 * const optimizer = new SGD(model.parameters(), { lr: 0.1 });
 * const scaler = new GradScaler(); // or { lossScale: 1024 } for a static scale
 * const loss = crossEntropy(model.forward(Tensor.from([1, 2, 3, 4], [2, 2])), [0, 1]);
 * scaler.scale(loss).backward();
 * scaler.step(optimizer); // unscales, checks, skips on inf/NaN: all on the GPU
 * scaler.update();
 * optimizer.zeroGrad();
 * assert.equal(await scaler.lastStepSkipped(), false); // a sync point
 * gpu.destroy();
 * ```
 */
export class GradScaler {
  /** The device holding the state. */
  readonly gpu: Gpu;
  #s: Settings;
  #scale: Tensor;
  #foundInf: Tensor;
  #counters: Tensor;
  #stages = new Map<Optimizer, Stage>();
  /** Optimizers whose gradients were checked but left scaled since the last update. */
  #deferred = new Set<Optimizer>();
  /** f32 [1]: 1/scale, written by a deferred unscale (made on first use). */
  #inverse: Tensor | null = null;
  /** f32 [1]: what a deferred step hands the optimizer as its gradScale (made on first use). */
  #stepScale: Tensor | null = null;
  #disposed = false;

  /** A scaler with PyTorch's defaults; see {@link GradScalerOptions}. */
  constructor(options: GradScalerOptions = {}) {
    checkOptionNames(
      at("constructor"),
      options,
      Object.keys(SCALER_OPTIONS),
      "check the spelling.",
    );
    const { gpu, ...rest } = options;
    if (rest.lossScale && options.initScale !== undefined && options.initScale !== rest.lossScale) {
      fail(
        ValueError,
        at("constructor"),
        "initScale and lossScale differ; give lossScale alone (static).",
      );
    }
    this.#s = settingsOf("constructor", rest);
    // A static scale never backs off: at 2^24 and above (the dynamic maxScale) any scaled
    // gradient over 65504 / 2^24 ≈ 0.004 overflows f16, so nearly every step is skipped.
    if (this.#s.lossScale >= 2 ** 24) {
      warnOnce(
        `GradScaler: a static lossScale of ${this.#s.lossScale} (≥ 2^24) overflows f16 for any ` +
          "scaled gradient over ≈0.004, so nearly every step will be skipped; use lossScale 0 " +
          "(dynamic) or a smaller power of two such as 1024.",
      );
    }
    this.gpu = gpu ?? getGpu();
    const g = this.gpu;
    [this.#scale, this.#foundInf, this.#counters] = untracked(() => [
      Tensor.from([this.#s.lossScale || this.#s.initScale], [1], { gpu: g }),
      Tensor.zeros([1], { gpu: g }),
      Tensor.from([0, this.#s.hysteresis, 0, 0], [4], { dtype: "i32", gpu: g }),
    ]);
  }

  /** Whether scaling is on. */
  get enabled(): boolean {
    return this.#s.enabled;
  }

  /** The f32 [1] flag the optimizer kernels read (non-zero = skip). Owned by the scaler. */
  get foundInf(): Tensor {
    this.#live("foundInf");
    return this.#foundInf;
  }

  /**
   * The f32 [1] tensor holding the scale in force, on the GPU (read it with
   * {@link GradScaler.getScale}; a numerics inspector binds it). Owned by the scaler.
   */
  get scaleTensor(): Tensor {
    this.#live("scaleTensor");
    return this.#scale;
  }

  /**
   * loss × scale, recorded on the tape: backward multiplies the gradient by
   * the scale read at backward time (run backward before `update()`).
   * `loss` must be f32. Disabled: returns `loss` itself.
   */
  scale(loss: Tensor): Tensor {
    if (!this.enabled) return loss;
    this.#live("scale");
    if (loss.dtype !== "f32" || loss.gpu !== this.gpu) {
      fail(
        DTypeError,
        at("scale"),
        `loss ${loss.describe()} must be f32 on the scaler's device; cast it.`,
      );
    }
    return scaleLoss(loss, this.#scale);
  }

  /**
   * Unscales every parameter's `.grad` in place (g ← g / scale) and records
   * inf/NaN in {@link GradScaler.foundInf}. Call it before clipping; at most
   * once per optimizer between `update()`s. No sync.
   *
   * With `{ inPlace: false }` the gradients are only checked and stay
   * scaled: `step()` then hands the optimizer 1/scale (times its own
   * `gradScale`) to multiply them by inside its fused kernel, and clipping
   * takes {@link GradScaler.inverseScale} as its `gradScale`. That is the
   * way for f16 gradients (apex O2): unscaled in their own storage, those
   * below 2^-24 (f16's smallest) would flush to zero, which the scale exists
   * to prevent.
   */
  unscale(optimizer: Optimizer, options: { inPlace?: boolean } = {}): void {
    if (!this.enabled) return;
    this.#live("unscale");
    const stage = this.#stages.get(optimizer);
    if (stage === "unscaled") {
      const what = "unscale() has already been called on this optimizer since the last update()";
      fail(StateError, at("unscale"), `${what}. Call step() and update() before unscaling again.`);
    }
    if (stage === "stepped") {
      fail(
        StateError,
        at("unscale"),
        "unscale() is being called after step(); call update() first.",
      );
    }
    const seen = new Set<GPUBuffer>(); // a gradient shared by two params is unscaled once
    const grads: Tensor[] = [];
    for (const p of optimizer.params) {
      const g = p.grad;
      if (!g || seen.has(g.buffer)) continue;
      seen.add(g.buffer);
      if (g.gpu !== this.gpu) {
        fail(
          ValueError,
          at("unscale"),
          `a gradient ${g.describe()} lives on another device than the scaler.`,
        );
      }
      grads.push(g);
    }
    const inPlace = options.inPlace ?? true;
    launchUnscaleInto(grads, this.#scale, this.#foundInf, { inPlace });
    if (!inPlace) {
      this.#deferred.add(optimizer);
      this.#inverse ??= untracked(() => Tensor.zeros([1], { gpu: this.gpu }));
      launchInverseScaleInto(this.#scale, this.#inverse);
    }
    this.#stages.set(optimizer, "unscaled");
  }

  /**
   * f32 [1]: 1/scale, as of the last `unscale(optimizer, { inPlace: false })`
   * (the factor left to apply to gradients checked but kept scaled; pass it
   * to `clipGradNorm` as `gradScale`). Owned by the scaler. Throws before
   * such an unscale.
   */
  get inverseScale(): Tensor {
    this.#live("inverseScale");
    if (this.#deferred.size === 0 || !this.#inverse) {
      fail(
        StateError,
        at("inverseScale"),
        "no unscale(optimizer, { inPlace: false }) since the last update(); call it first.",
      );
    }
    return this.#inverse;
  }

  /**
   * Unscales (unless `unscale()` ran) and calls `optimizer.step` with the
   * found-inf flag, so an overflowing step is skipped on the GPU. Once per
   * optimizer between `update()`s. `signals.gradScale` is passed on
   * (e.g. a clip coefficient). No sync.
   */
  step(optimizer: Optimizer, signals: { gradScale?: Tensor } = {}): void {
    const gradScale = signals.gradScale;
    if (!this.enabled) return gradScale ? optimizer.step({ gradScale }) : optimizer.step();
    this.#live("step");
    if (this.#stages.get(optimizer) === "stepped") {
      const what = "step() has already been called on this optimizer since the last update()";
      fail(StateError, at("step"), `${what}. Call update() once per iteration, after step().`);
    }
    if (!this.#stages.has(optimizer)) this.unscale(optimizer);
    const out: StepSignals = { foundInf: this.#foundInf };
    if (this.#deferred.has(optimizer)) {
      // The gradients are still scaled: the fused update multiplies them by 1/scale (× gradScale).
      this.#stepScale ??= untracked(() => Tensor.zeros([1], { gpu: this.gpu }));
      launchInverseScaleInto(this.#scale, this.#stepScale, gradScale);
      out.gradScale = this.#stepScale;
    } else if (gradScale) out.gradScale = gradScale;
    optimizer.step(out);
    this.#stages.set(optimizer, "stepped");
  }

  /**
   * Updates the scale on the GPU (see the class docs), records whether the
   * step was skipped, and clears the found-inf flag. With `newScale` the
   * scale is set to it instead (any mode). No sync.
   */
  update(newScale?: number): void {
    if (!this.enabled) return;
    this.#live("update");
    const stepped = this.#stages.size > 0;
    const s = this.#s;
    if (newScale !== undefined) {
      checkScale("update", "newScale", newScale);
      if (s.lossScale) {
        fail(
          ValueError,
          at("update"),
          `newScale cannot change the static lossScale ${s.lossScale}.`,
        );
      }
    } else if (!stepped) {
      fail(
        StateError,
        at("update"),
        "no unscale() or step() since the last update(); call step() first.",
      );
    }
    // The settings are read when the kernel is recorded and again at each replay of a
    // captured step (a loaded state may change them).
    const params = () => {
      const s = this.#s;
      const mode = newScale !== undefined
        ? UPDATE_MODE.set
        : s.lossScale
        ? UPDATE_MODE.static
        : UPDATE_MODE.dynamic;
      return {
        mode,
        stepped,
        growth: s.growthFactor,
        backoff: s.backoffFactor,
        interval: s.growthInterval,
        hysteresis: s.hysteresis,
        minScale: s.minScale,
        maxScale: s.maxScale,
        newScale: newScale ?? 0,
      };
    };
    launchScaleUpdateInto(
      { scale: this.#scale, foundInf: this.#foundInf, counters: this.#counters },
      params,
    );
    this.#stages.clear();
    this.#deferred.clear();
  }

  /** The current scale (1 when disabled). **A sync point**: waits for the GPU. */
  async getScale(): Promise<number> {
    if (!this.enabled) return 1;
    return (await this.#live("getScale").#scale.read())[0];
  }

  /** Whether the step before the last `update()` was skipped. **A sync point.** */
  async lastStepSkipped(): Promise<boolean> {
    return this.enabled && (await this.#readCounters())[COUNTER.lastSkipped] !== 0;
  }

  /** Steps skipped for inf/NaN gradients so far. **A sync point.** */
  async skippedSteps(): Promise<number> {
    return this.enabled ? (await this.#readCounters())[COUNTER.skippedSteps] : 0;
  }

  /**
   * The options in force, as {@link stateDict} saves them (no sync): what a
   * saved state that carries only PyTorch's fields is completed with.
   *
   * @example
   * ```ts
   * import assert from "node:assert/strict";
   * import { GradScaler, initGpu } from "../mod.ts";
   * const gpu = await initGpu({ matmulTiling: "default" });
   * const scaler = new GradScaler({ growthInterval: 100 });
   * assert.equal(scaler.options.growthInterval, 100);
   * assert.equal(scaler.options.hysteresis, 1);
   * scaler.dispose();
   * gpu.destroy();
   * ```
   */
  get options(): GradScalerState["options"] {
    return { ...this.#live("options").#s };
  }

  /** The state as plain numbers (for checkpoints). **A sync point.** */
  async stateDict(): Promise<GradScalerState> {
    const c = await this.#readCounters();
    return {
      scale: await this.getScale(),
      growthTracker: c[COUNTER.growthTracker],
      hysteresisLeft: c[COUNTER.hysteresisLeft],
      skippedSteps: c[COUNTER.skippedSteps],
      options: { ...this.#s },
    };
  }

  /**
   * Throws a ValueError naming the first field of `state` this scaler cannot
   * load (its type, range or mode); changes nothing.
   */
  checkStateDict(state: GradScalerState): void {
    this.#parseState(state);
  }

  /** Restores a {@link GradScalerState}: validates every field, then writes the GPU state. */
  loadStateDict(state: GradScalerState): void {
    const { s, scale, tracker, left, skipped } = this.#parseState(state);
    this.#s = s;
    this.#scale.writeBytes(new Uint8Array(new Float32Array([scale]).buffer));
    this.#foundInf.writeBytes(new Uint8Array(4));
    this.#counters.writeBytes(new Uint8Array(new Int32Array([tracker, left, skipped, 0]).buffer));
    this.#stages.clear();
    this.#deferred.clear();
  }

  /** The checked fields of `state` (throws on the first bad one). */
  #parseState(state: GradScalerState) {
    this.#live("loadStateDict");
    if (typeof state !== "object" || state === null || typeof state.options !== "object") {
      fail(
        ValueError,
        at("loadStateDict"),
        "state must be an object from stateDict() with an options field.",
      );
    }
    const s = settingsOf("loadStateDict", state.options);
    if (s.enabled !== this.enabled) {
      fail(
        ValueError,
        at("loadStateDict"),
        `the state has enabled=${s.enabled}, this scaler the opposite.`,
      );
    }
    const scale = checkScale("loadStateDict", "scale", state.scale);
    if (s.lossScale && scale !== s.lossScale) {
      fail(
        ValueError,
        at("loadStateDict"),
        `scale ${scale} differs from the static lossScale ${s.lossScale}.`,
      );
    }
    const tracker = checkCount("loadStateDict", "growthTracker", state.growthTracker, 0);
    if (tracker >= s.growthInterval) {
      fail(
        ValueError,
        at("loadStateDict"),
        `growthTracker ${tracker} must be below ${s.growthInterval}.`,
      );
    }
    const left = checkCount("loadStateDict", "hysteresisLeft", state.hysteresisLeft, 0);
    if (left > s.hysteresis) {
      fail(
        ValueError,
        at("loadStateDict"),
        `hysteresisLeft ${left} exceeds hysteresis ${s.hysteresis}.`,
      );
    }
    const skipped = checkCount("loadStateDict", "skippedSteps", state.skippedSteps, 0);
    return { s, scale, tracker, left, skipped };
  }

  /** Frees the GPU state; the scaler is unusable afterwards. Idempotent. */
  dispose(): void {
    this.#disposed = true;
    for (const t of [this.#scale, this.#foundInf, this.#counters]) t.dispose();
    this.#inverse?.dispose();
    this.#stepScale?.dispose();
  }

  async #readCounters(): Promise<Uint32Array> {
    const t = this.#live("read the state").#counters;
    return new Uint32Array(await this.gpu.readBuffer(t.buffer, 16));
  }

  #live(method: string): this {
    if (this.#disposed) {
      fail(StateError, at(method), "this GradScaler was disposed; create a new one.");
    }
    return this;
  }
}
