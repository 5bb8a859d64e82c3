/**
 * Fused optimizers over fp32 master weights: one kernel per parameter tensor
 * reads the gradient (f32 or f16), the fp32 state and the step signals, and
 * writes the new master and its f16 working copy. A step with `foundInf` set
 * is skipped on the GPU (masters, copies, moments and Adam's step count stay
 * bit-identical); nothing reads back to the CPU.
 *
 * Learning rates: every group's `lr` (and `weightDecay`) may be assigned
 * between steps, `optimizer.groups[i].lr = 1e-4`; {@link LrScheduler} does
 * exactly that. Other hyper-parameters are fixed at construction (or
 * restored by `loadStateDict`).
 */
import { untracked } from "../gpu/scope.ts";
import { Tensor } from "../gpu/tensor.ts";
import { FusedOptimizer, type Group, type ParamGroup } from "./_fused_optimizer.ts";
import { fail, need, type OptimizerStateDict } from "./_optimizer_state.ts";
import {
  launchAdamUpdate,
  launchSgdUpdate,
  launchStepCount,
  type UpdateBuffers,
} from "./kernels/optimizer_kernels.ts";

export type { Group, OptimizerStateDict, ParamGroup };

function commonChecks(h: { lr: number; weightDecay: number }): string[] {
  const errors: string[] = [];
  if (!need.nonNegative(h.lr)) errors.push(`lr must be a finite number >= 0, got ${h.lr}`);
  if (!need.nonNegative(h.weightDecay)) {
    errors.push(`weightDecay must be a finite number >= 0, got ${h.weightDecay}`);
  }
  return errors;
}

function checkOptionKeys(kind: string, options: object, known: string[]): void {
  const unknown = Object.keys(options ?? {}).filter((k) => !known.includes(k));
  fail(`${kind}: invalid options`, unknown.map((k) => `unknown option ${k} (known: ${known})`));
}

/** A parameter group of {@link FusedSGD}. */
export interface SGDParamGroup extends ParamGroup {
  /** Momentum of this group (default: the optimizer's). */
  momentum?: number;
  /** Nesterov momentum for this group (default: the optimizer's). */
  nesterov?: boolean;
}

/** Options of {@link FusedSGD}: the defaults of every group. */
export interface FusedSGDOptions {
  /** Learning rate, >= 0. */
  lr: number;
  /** Momentum factor in [0, 1) (default 0: plain SGD, no state). */
  momentum?: number;
  /** Nesterov momentum (default false; needs momentum > 0). */
  nesterov?: boolean;
  /** L2 weight decay added to the gradient (default 0). */
  weightDecay?: number;
}

/** A {@link FusedSGD} group as the optimizer keeps it. */
export interface SGDGroup extends Group {
  /** Momentum factor. */
  readonly momentum: number;
  /** Nesterov momentum. */
  readonly nesterov: boolean;
}

/**
 * torch.optim.SGD (dampening 0) as one fused kernel per parameter:
 * g = scale·∇ + wd·p; v = m·v + g (v starts at 0, so the first v is g);
 * g = Nesterov ? g + m·v : v; p −= lr·g; then the working copy is refreshed.
 *
 * @example
 * ```ts
 * import { FusedSGD, initGpu, sum, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const w = Tensor.from([1, 2], [2], { requiresGrad: true });
 * const opt = new FusedSGD([w], { lr: 0.1, momentum: 0.9, nesterov: true });
 * sum(w).backward(); // grad [1, 1]
 * opt.step({ foundInf: Tensor.from([1], [1]) }); // skipped on the GPU when foundInf ≠ 0
 * console.assert((await w.read())[0] === 1);
 * opt.step(); // v = g; p −= lr · (g + 0.9 · v)
 * opt.zeroGrad();
 * console.assert(Math.abs((await w.read())[0] - 0.81) < 1e-6);
 * gpu.destroy();
 * ```
 */
export class FusedSGD extends FusedOptimizer<SGDGroup> {
  /** An optimizer over `params` (tensors, or groups overriding `options`). */
  constructor(params: readonly Tensor[] | readonly SGDParamGroup[], options: FusedSGDOptions) {
    checkOptionKeys("FusedSGD", options, ["lr", "momentum", "nesterov", "weightDecay"]);
    super("FusedSGD", params, {
      lr: options?.lr,
      weightDecay: options?.weightDecay ?? 0,
      momentum: options?.momentum ?? 0,
      nesterov: options?.nesterov ?? false,
    });
    this.allocateState();
  }

  /** @internal */
  protected checkHyper(h: Omit<SGDGroup, "params">): string[] {
    const errors = commonChecks(h);
    if (!need.unit(h.momentum)) errors.push(`momentum must be in [0, 1), got ${h.momentum}`);
    if (typeof h.nesterov !== "boolean") errors.push(`nesterov must be a boolean`);
    else if (h.nesterov && !(h.momentum > 0)) {
      errors.push(`nesterov needs momentum > 0 (got momentum ${h.momentum})`);
    }
    return errors;
  }

  /** @internal */
  protected stateNames(h: Omit<SGDGroup, "params">): string[] {
    return h.momentum > 0 ? ["momentumBuffer"] : [];
  }

  /** @internal */
  protected update(b: UpdateBuffers, state: Record<string, Tensor>, g: SGDGroup): void {
    launchSgdUpdate(b, g.momentum > 0 ? state.momentumBuffer : null, g);
  }
}

/** A parameter group of {@link FusedAdam}. */
export interface AdamParamGroup extends ParamGroup {
  /** (β₁, β₂) of this group (default: the optimizer's). */
  betas?: readonly [number, number];
  /** ε of this group (default: the optimizer's). */
  eps?: number;
}

/** Options of {@link FusedAdam}. */
export interface FusedAdamOptions {
  /** Learning rate, >= 0 (default 1e-3). */
  lr?: number;
  /** Moment decay rates (β₁, β₂), each in [0, 1) (default [0.9, 0.999]). */
  betas?: readonly [number, number];
  /** Added to √v̂ (default 1e-8). */
  eps?: number;
  /** Weight decay (default 0; AdamW: 0.01). */
  weightDecay?: number;
  /** Divide the moments by 1 − βᵗ, as apex FusedAdam's `bias_correction` (default true). */
  biasCorrection?: boolean;
  /** Decoupled weight decay p −= lr·wd·p (AdamW) instead of L2 added to the gradient (default false). */
  decoupledWeightDecay?: boolean;
}

/** A {@link FusedAdam} group as the optimizer keeps it. */
export interface AdamGroup extends Group {
  /** (β₁, β₂). */
  readonly betas: readonly [number, number];
  /** ε. */
  readonly eps: number;
}

const ADAM_KEYS = ["lr", "betas", "eps", "weightDecay", "biasCorrection", "decoupledWeightDecay"];

/**
 * torch.optim.Adam / AdamW as one fused kernel per parameter, fp32 moments
 * whatever the gradient dtype. The step count t lives in a GPU counter that
 * advances only on steps that are not skipped; it is shared by all groups
 * (as apex's per-group step, it advances whenever any parameter has a
 * gradient).
 *
 * @example
 * ```ts
 * import { FusedAdam, initGpu, sum, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const weights = [Tensor.full([2, 2], 1, { requiresGrad: true })];
 * const biasesAndNorms = [Tensor.zeros([2], { requiresGrad: true })];
 * const opt = new FusedAdam([
 *   { params: weights },
 *   { params: biasesAndNorms, weightDecay: 0 }, // the BERT recipe
 * ], { lr: 1e-3, weightDecay: 0.01, decoupledWeightDecay: true });
 * sum(weights[0]).backward();
 * opt.step(); // under loss scaling: opt.step({ foundInf: scaler.foundInf })
 * const saved = await opt.stateDict(); // a sync point
 * console.assert(saved.step === 1);
 * gpu.destroy();
 * ```
 */
export class FusedAdam extends FusedOptimizer<AdamGroup> {
  /** Whether the moments are bias-corrected. */
  readonly biasCorrection: boolean;
  /** Whether weight decay is decoupled (AdamW). */
  readonly decoupledWeightDecay: boolean;
  #step: Tensor;

  /** An optimizer over `params` (tensors, or groups overriding `options`). */
  constructor(
    params: readonly Tensor[] | readonly AdamParamGroup[],
    options: FusedAdamOptions = {},
  ) {
    checkOptionKeys("FusedAdam", options, ADAM_KEYS);
    super("FusedAdam", params, {
      lr: options.lr ?? 1e-3,
      weightDecay: options.weightDecay ?? 0,
      betas: options.betas ?? [0.9, 0.999],
      eps: options.eps ?? 1e-8,
    });
    const { biasCorrection = true, decoupledWeightDecay = false } = options;
    const flags = { biasCorrection, decoupledWeightDecay };
    fail(
      "FusedAdam: invalid options",
      Object.entries(flags).filter(([, v]) => typeof v !== "boolean").map(([k]) =>
        `${k} must be a boolean`
      ),
    );
    this.biasCorrection = biasCorrection;
    this.decoupledWeightDecay = decoupledWeightDecay;
    const gpu = this.params[0].gpu;
    // u32 [1] on the GPU (an i32 tensor holds the bytes; kernels bind it as u32).
    this.#step = untracked(() => Tensor.zeros([1], { dtype: "i32", gpu }));
    this.allocateState();
  }

  /** @internal */
  protected checkHyper(h: Omit<AdamGroup, "params">): string[] {
    const errors = commonChecks(h);
    const b = h.betas;
    if (!Array.isArray(b) || b.length !== 2 || !b.every(need.unit)) {
      errors.push(`betas must be two numbers in [0, 1), got ${JSON.stringify(b)}`);
    }
    if (!need.nonNegative(h.eps)) errors.push(`eps must be a finite number >= 0, got ${h.eps}`);
    return errors;
  }

  /** @internal */
  protected stateNames(): string[] {
    return ["expAvg", "expAvgSq"];
  }

  /** @internal */
  protected override settings(): Record<string, boolean> {
    return {
      biasCorrection: this.biasCorrection,
      decoupledWeightDecay: this.decoupledWeightDecay,
    };
  }

  /** @internal */
  protected override beforeUpdates(foundInf: Tensor): void {
    launchStepCount(this.#step, foundInf);
  }

  /** @internal */
  protected update(b: UpdateBuffers, state: Record<string, Tensor>, g: AdamGroup): void {
    launchAdamUpdate(b, { step: this.#step, expAvg: state.expAvg, expAvgSq: state.expAvgSq }, {
      ...g,
      decoupled: this.decoupledWeightDecay,
      biasCorrection: this.biasCorrection,
    });
  }

  /** @internal */
  protected override async readExtra(): Promise<{ step: number }> {
    const bytes = await this.#step.gpu.readBuffer(this.#step.buffer, 4);
    return { step: new Uint32Array(bytes)[0] };
  }

  /** @internal */
  protected override checkExtra(s: OptimizerStateDict): string[] {
    const ok = Number.isInteger(s.step) && s.step! >= 0 && s.step! < 2 ** 32;
    return ok ? [] : [`step must be an integer in [0, 2^32), got ${s.step}`];
  }

  /** @internal */
  protected override loadExtra(s: OptimizerStateDict): void {
    this.#step.writeBytes(new Uint8Array(Uint32Array.of(s.step!).buffer));
  }

  /** Frees the moments and the step counter. */
  override dispose(): void {
    super.dispose();
    this.#step.dispose();
  }
}

/**
 * AdamW: {@link FusedAdam} with decoupled weight decay and PyTorch's default
 * weight decay of 0.01.
 *
 * @example
 * ```ts
 * import { AdamW, initGpu, Linear } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Linear(4, 2, { seed: 1 });
 * const opt = new AdamW(model.parameters(), { lr: 3e-4 });
 * console.assert(opt.groups[0].weightDecay === 0.01);
 * gpu.destroy();
 * ```
 */
export class AdamW extends FusedAdam {
  /** An AdamW optimizer over `params`. */
  constructor(
    params: readonly Tensor[] | readonly AdamParamGroup[],
    options: FusedAdamOptions = {},
  ) {
    super(params, { weightDecay: 0.01, decoupledWeightDecay: true, ...options });
  }
}
