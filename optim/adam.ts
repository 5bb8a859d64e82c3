/**
 * Adam and AdamW over fp32 master weights as one fused kernel (up to 16
 * parameter tensors per dispatch), with fp32 moments whatever the gradient
 * dtype, or compact ones (`stateDtype`: bitsandbytes' 8-bit blockwise
 * states, torchao's bf16 states; docs/optimizer_states.md). A step with
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
import { need, type OptimizerStateDict, type StateSpec } from "./_optimizer_state.ts";
import { dynamicCode } from "./_dynamic_code.ts";
import { quantizeStates } from "./quantize_states.ts";
import {
  launchCompactAdamUpdatesInto,
  STATE_BLOCK,
  stateBlocks,
} from "./kernels/compact_update.ts";
import {
  launchAdamUpdatesInto,
  launchStepCountInto,
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
  /**
   * How the moments m and v are stored (default "f32"; the update always
   * runs in f32). "8bit": bitsandbytes' `Adam8bit` / `AdamW8bit` (torchao's
   * `AdamW8bit`): one byte each, a code of bitsandbytes' dynamic map, with
   * one f32 absmax per block of 256 elements; 2 bytes per parameter
   * instead of 8. "bf16": torchao's bf16 states, rounded stochastically
   * (deterministic from the step, so a resumed run is exact); 4 bytes.
   */
  stateDtype?: StateDtype;
  /**
   * With `stateDtype: "8bit"`, tensors of fewer elements keep f32 states
   * (bitsandbytes' `min_8bit_size`; default 4096): biases and LayerNorm
   * weights cost little and quantize poorly.
   */
  min8bitSize?: number;
}

/** How Adam stores its moments (see {@link AdamOptions.stateDtype}). */
export type StateDtype = "f32" | "bf16" | "8bit";

const STATE_DTYPES: readonly StateDtype[] = ["f32", "bf16", "8bit"];

/** bitsandbytes' `min_8bit_size`. */
const MIN_8BIT_SIZE = 4096;

/** A {@link Adam} group as the optimizer keeps it. */
export interface AdamGroup extends Group {
  /** (β₁, β₂). */
  readonly betas: readonly [number, number];
  /** ε. */
  readonly eps: number;
}

const ADAM_KEYS = [
  "lr",
  "betas",
  "eps",
  "weightDecay",
  "biasCorrection",
  "decoupledWeightDecay",
  "stateDtype",
  "min8bitSize",
];

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
  /** How the moments are stored. */
  readonly stateDtype: StateDtype;
  /** With 8-bit states, the size below which a tensor keeps f32 states. */
  readonly min8bitSize: number;
  #step: Tensor;
  /** bitsandbytes' signed and unsigned maps (8bit only). */
  #codes: Tensor | null = null;
  /** Each parameter's stochastic-rounding seed (bf16 states): its index. */
  #seeds: Map<Tensor, number>;

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
    const { biasCorrection = true, decoupledWeightDecay = false, stateDtype = "f32" } = options;
    const flags = { biasCorrection, decoupledWeightDecay };
    const errors = Object.entries(flags).filter(([, v]) => typeof v !== "boolean").map(([k]) =>
      `${k} must be a boolean`
    );
    errors.push(...stateDtypeErrors(stateDtype, options.min8bitSize));
    fail(ValueError, "Adam: invalid options", errors);
    this.biasCorrection = biasCorrection;
    this.decoupledWeightDecay = decoupledWeightDecay;
    this.stateDtype = stateDtype;
    this.min8bitSize = options.min8bitSize ?? MIN_8BIT_SIZE;
    this.#seeds = new Map(this.params.map((p, i) => [p, i]));
    const gpu = this.params[0].gpu;
    // u32 [1] on the GPU (an i32 tensor holds the bytes; kernels bind it as u32).
    this.#step = untracked(() => Tensor.zeros([1], { dtype: "i32", gpu }));
    if (stateDtype === "8bit") {
      const maps = new Float32Array(512);
      maps.set(dynamicCode(true));
      maps.set(dynamicCode(false), 256);
      this.#codes = untracked(() => Tensor.from(maps, [512], { gpu }));
    }
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
  protected override stateSpecs(
    _: Omit<AdamGroup, "params">,
    p: Tensor,
  ): Record<string, StateSpec> {
    const n = p.size;
    if (this.stateDtype === "bf16") {
      return { expAvg: { format: "bf16", length: n }, expAvgSq: { format: "bf16", length: n } };
    }
    if (this.stateDtype === "f32" || n < this.min8bitSize) {
      return { expAvg: { format: "f32", length: n }, expAvgSq: { format: "f32", length: n } };
    }
    const blocks = stateBlocks(n);
    return {
      expAvg: { format: "u8", length: n },
      expAvgSq: { format: "u8", length: n },
      expAvgAbsmax: { format: "f32", length: blocks },
      expAvgSqAbsmax: { format: "f32", length: blocks },
    };
  }

  /**
   * An f32 state (a run PyTorch continued, or one trained with f32 states)
   * quantized into this optimizer's compact moments; anything else as given.
   * @internal
   */
  protected override converted(s: OptimizerStateDict): OptimizerStateDict {
    const f32 = (s?.stateDtype ?? "f32") === "f32";
    if (this.stateDtype === "f32" || !f32 || s?.kind !== this.kind || !Array.isArray(s.state)) {
      return s;
    }
    const extra = this.stateDtype === "8bit"
      ? { stateDtype: this.stateDtype, min8bitSize: this.min8bitSize }
      : { stateDtype: this.stateDtype };
    const p = this.params;
    return quantizeStates(s, (i) => (p[i] ? this.stateSpecs(this.groups[0], p[i]) : null), extra);
  }

  /** @internal */
  protected override nonNegativeState(): readonly string[] {
    return ["expAvgSq", "expAvgAbsmax", "expAvgSqAbsmax"];
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
    launchStepCountInto(this.#step, foundInf);
  }

  /** @internal */
  protected update(updates: ParamUpdate[], signals: UpdateSignals, g: AdamGroup): void {
    const flags = { decoupled: this.decoupledWeightDecay, biasCorrection: this.biasCorrection };
    const step = { ...signals, step: this.#step };
    // Tensors below min8bitSize keep f32 states: the f32 kernel updates them.
    const compact = (u: ParamUpdate) => this.stateDtype === "bf16" || "expAvgAbsmax" in u.state;
    const full = updates.filter((u) => !compact(u));
    if (full.length > 0) launchAdamUpdatesInto(full, step, g, flags);
    if (full.length === updates.length) return;
    launchCompactAdamUpdatesInto(
      updates.filter(compact),
      { ...step, codes: this.#codes ?? undefined },
      g,
      { ...flags, states: this.stateDtype as "8bit" | "bf16", seeds: this.#seeds },
    );
  }

  /** @internal */
  protected override async readExtra(): Promise<
    { step: number; stateDtype?: StateDtype; min8bitSize?: number }
  > {
    const bytes = await this.#step.gpu.readBuffer(this.#step.buffer, 4);
    const step = new Uint32Array(bytes)[0];
    // f32 state dicts stay as they were before compact states existed.
    if (this.stateDtype === "f32") return { step };
    if (this.stateDtype === "bf16") return { step, stateDtype: "bf16" };
    return { step, stateDtype: "8bit", min8bitSize: this.min8bitSize };
  }

  /** @internal */
  protected override checkExtra(s: OptimizerStateDict): string[] {
    const ok = Number.isInteger(s.step) && s.step! >= 0 && s.step! < 2 ** 32;
    const errors = ok ? [] : [`step must be an integer in [0, 2^32), got ${s.step}`];
    const saved = s.stateDtype ?? "f32";
    if (saved !== this.stateDtype) {
      errors.push(
        `it holds stateDtype ${JSON.stringify(saved)} moments, this optimizer keeps ` +
          `"${this.stateDtype}": construct it with { stateDtype: ${
            JSON.stringify(saved)
          } } to load them`,
      );
    } else if (saved === "8bit" && s.min8bitSize !== this.min8bitSize) {
      errors.push(
        `its 8-bit states were kept from min8bitSize ${s.min8bitSize}, this optimizer's is ` +
          `${this.min8bitSize}: construct it with { min8bitSize: ${s.min8bitSize} }`,
      );
    }
    return errors;
  }

  /** @internal */
  protected override loadExtra(s: OptimizerStateDict): void {
    this.#step.writeBytes(new Uint8Array(Uint32Array.of(s.step!).buffer));
  }

  /** Frees the moments and the step counter. */
  override dispose(): void {
    super.dispose();
    this.#step.dispose();
    this.#codes?.dispose();
  }
}

/** Problems with `stateDtype` and `min8bitSize`, each naming the option and its fix. */
function stateDtypeErrors(stateDtype: unknown, min8bitSize: unknown): string[] {
  if (!STATE_DTYPES.includes(stateDtype as StateDtype)) {
    return [
      `stateDtype must be "f32", "bf16" or "8bit" (bitsandbytes' AdamW8bit is "8bit", ` +
      `torchao's bf16 states "bf16"), got ${JSON.stringify(stateDtype)}`,
    ];
  }
  if (min8bitSize === undefined) return [];
  if (stateDtype !== "8bit") {
    return [
      `min8bitSize applies to stateDtype "8bit" only; leave it out or pass stateDtype: "8bit"`,
    ];
  }
  const ok = Number.isSafeInteger(min8bitSize) && (min8bitSize as number) >= 0;
  return ok ? [] : [
    `min8bitSize must be an integer >= 0 (elements; bitsandbytes' min_8bit_size is ` +
    `${MIN_8BIT_SIZE}, a multiple of the ${STATE_BLOCK}-element block), got ${min8bitSize}`,
  ];
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
