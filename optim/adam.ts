/**
 * Adam and AdamW over fp32 master weights as one fused kernel (up to 16
 * parameter tensors per dispatch), with fp32 moments whatever the gradient dtype. A step with
 * `foundInf` set is skipped on the GPU (masters, copies, moments and the step
 * count t stay bit-identical); nothing reads back to the CPU.
 *
 * Every group's `lr` (and `weightDecay`) may be assigned between steps,
 * `optimizer.groups[i].lr = 1e-4`, which is what `LrScheduler` does. Other
 * hyper-parameters are fixed at construction (or restored by `loadStateDict`).
 */
import { fail, Tensor, untracked, ValueError } from "../gpu/mod.ts";
import {
  checkOptionKeys,
  commonChecks,
  FusedOptimizer,
  type Group,
  type ParamGroup,
} from "./_fused_optimizer.ts";
import { need, type OptimizerStateDict } from "./_optimizer_state.ts";
import {
  launchAdamUpdates,
  launchStepCount,
  type ParamUpdate,
  type UpdateSignals,
} from "./kernels/update.ts";

/** A parameter group of {@link Adam}. */
export interface AdamParamGroup extends ParamGroup {
  /** (β₁, β₂) of this group (default: the optimizer's). */
  betas?: readonly [number, number];
  /** ε of this group (default: the optimizer's). */
  eps?: number;
}

/** Options of {@link Adam}. */
export interface AdamOptions {
  /** PyTorch's `fused=True`: accepted, and always so (one fused kernel). */
  fused?: true;
  /** Learning rate, >= 0 (default 1e-3). */
  lr?: number;
  /** Moment decay rates (β₁, β₂), each in [0, 1) (default [0.9, 0.999]). */
  betas?: readonly [number, number];
  /** Added to √v̂ (default 1e-8). */
  eps?: number;
  /** Weight decay (default 0; AdamW: 0.01). */
  weightDecay?: number;
  /** Divide the moments by 1 − βᵗ, as apex Adam's `bias_correction` (default true). */
  biasCorrection?: boolean;
  /** Decoupled weight decay p −= lr·wd·p (AdamW) instead of L2 added to the gradient (default false). */
  decoupledWeightDecay?: boolean;
}

/** A {@link Adam} group as the optimizer keeps it. */
export interface AdamGroup extends Group {
  /** (β₁, β₂). */
  readonly betas: readonly [number, number];
  /** ε. */
  readonly eps: number;
}

const ADAM_KEYS = ["lr", "betas", "eps", "weightDecay", "biasCorrection", "decoupledWeightDecay"];

/**
 * torch.optim.Adam / AdamW as one fused kernel, fp32 moments
 * whatever the gradient dtype. The step count t lives in a GPU counter that
 * advances only on steps that are not skipped; it is shared by all groups
 * (as apex's per-group step, it advances whenever any parameter has a
 * gradient).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { Adam, initGpu, sum, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const weights = [Tensor.full([2, 2], 1, { requiresGrad: true })];
 * const biasesAndNorms = [Tensor.zeros([2], { requiresGrad: true })];
 * const opt = new Adam([
 *   { params: weights },
 *   { params: biasesAndNorms, weightDecay: 0 }, // the BERT recipe
 * ], { lr: 1e-3, weightDecay: 0.01, decoupledWeightDecay: true });
 * sum(weights[0]).backward();
 * opt.step(); // under loss scaling: opt.step({ foundInf: scaler.foundInf })
 * const saved = await opt.stateDict(); // a sync point
 * assert.equal(saved.step, 1);
 * gpu.destroy();
 * ```
 */
export class Adam extends FusedOptimizer<AdamGroup> {
  /** Whether the moments are bias-corrected. */
  readonly biasCorrection: boolean;
  /** Whether weight decay is decoupled (AdamW). */
  readonly decoupledWeightDecay: boolean;
  #step: Tensor;

  /** An optimizer over `params` (tensors, or groups overriding `options`). */
  constructor(
    params: readonly Tensor[] | readonly AdamParamGroup[],
    options: AdamOptions = {},
  ) {
    checkOptionKeys("Adam", options, ADAM_KEYS);
    super("Adam", params, {
      lr: options.lr ?? 1e-3,
      weightDecay: options.weightDecay ?? 0,
      betas: options.betas ?? [0.9, 0.999],
      eps: options.eps ?? 1e-8,
    });
    const { biasCorrection = true, decoupledWeightDecay = false } = options;
    const flags = { biasCorrection, decoupledWeightDecay };
    fail(
      ValueError,
      "Adam: invalid options",
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
  protected override nonNegativeState(): readonly string[] {
    return ["expAvgSq"];
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
  protected update(updates: ParamUpdate[], signals: UpdateSignals, g: AdamGroup): void {
    launchAdamUpdates(updates, { ...signals, step: this.#step }, g, {
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
 * AdamW: {@link Adam} with decoupled weight decay and PyTorch's default
 * weight decay of 0.01.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AdamW, initGpu, Linear } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Linear(4, 2, { seed: 1 });
 * const opt = new AdamW(model.parameters(), { lr: 3e-4 });
 * assert.equal(opt.groups[0].weightDecay, 0.01);
 * gpu.destroy();
 * ```
 */
export class AdamW extends Adam {
  /** An AdamW optimizer over `params`. */
  constructor(
    params: readonly Tensor[] | readonly AdamParamGroup[],
    options: AdamOptions = {},
  ) {
    super(params, { weightDecay: 0.01, decoupledWeightDecay: true, ...options });
  }
}
