/**
 * SGD over fp32 master weights as one fused kernel (up to 16 parameter tensors
 * per dispatch): for each tensor it reads the gradient (f32, f16 or bf16), the
 * momentum buffer and the step signals, and writes the new master and its f16
 * or bf16 working copy. A step with `foundInf` set is skipped on the GPU;
 * nothing reads back to the CPU.
 *
 * Every group's `lr` (and `weightDecay`) may be assigned between steps,
 * `optimizer.groups[i].lr = 1e-4`, which is what `LrScheduler` does. Other
 * hyper-parameters are fixed at construction (or restored by `loadStateDict`).
 */
import { noteCaptureCheck, type Tensor } from "../gpu/mod.ts";
import {
  checkOptionKeys,
  commonChecks,
  FusedOptimizer,
  type Group,
  type ParamGroup,
} from "./_fused_optimizer.ts";
import { need } from "./_optimizer_state.ts";
import { launchSgdUpdatesInto, type ParamUpdate, type UpdateSignals } from "./kernels/update.ts";

/** A parameter group of {@link SGD}. */
export interface SGDParamGroup extends ParamGroup {
  /** Momentum of this group (default: the optimizer's). */
  momentum?: number;
  /** Nesterov momentum for this group (default: the optimizer's). */
  nesterov?: boolean;
}

/** Options of {@link SGD}: the defaults of every group. */
export interface SGDOptions {
  /** PyTorch's `fused=True`: accepted, and always so (one fused kernel). */
  fused?: true;
  /** Learning rate, >= 0. */
  lr: number;
  /** Momentum factor in [0, 1) (default 0: plain SGD, no state). */
  momentum?: number;
  /** Nesterov momentum (default false; needs momentum > 0). */
  nesterov?: boolean;
  /** L2 weight decay added to the gradient (default 0). */
  weightDecay?: number;
}

/** A {@link SGD} group as the optimizer keeps it. */
export interface SGDGroup extends Group {
  /** Momentum factor. */
  readonly momentum: number;
  /** Nesterov momentum. */
  readonly nesterov: boolean;
}

/**
 * torch.optim.SGD (dampening 0) as one fused kernel:
 * g = scale·∇ + wd·p; v = m·v + g (v starts at 0, so the first v is g);
 * g = Nesterov ? g + m·v : v; p −= lr·g; then the working copy is refreshed.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { SGD, initGpu, sum, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const w = Tensor.from([1, 2], [2], { requiresGrad: true });
 * const opt = new SGD([w], { lr: 0.1, momentum: 0.9, nesterov: true });
 * sum(w).backward(); // grad [1, 1]
 * opt.step({ foundInf: Tensor.from([1], [1]) }); // skipped on the GPU when foundInf ≠ 0
 * assert.equal((await w.read())[0], 1);
 * opt.step(); // v = g; p −= lr · (g + 0.9 · v)
 * opt.zeroGrad();
 * const [after2] = await w.read();
 * assert.ok(Math.abs(after2 - 0.81) < 1e-6, `w ${after2}`);
 * gpu.destroy();
 * ```
 */
export class SGD extends FusedOptimizer<SGDGroup> {
  /** An optimizer over `params` (tensors, or groups overriding `options`). */
  constructor(params: readonly Tensor[] | readonly SGDParamGroup[], options: SGDOptions) {
    checkOptionKeys("SGD", options, ["lr", "momentum", "nesterov", "weightDecay"]);
    super("SGD", params, {
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
  protected update(updates: ParamUpdate[], signals: UpdateSignals, g: SGDGroup): void {
    // Momentum (and Nesterov with it) picks the kernel: a captured step records again if either turns.
    const kernel = (h: SGDGroup) => `${h.momentum > 0}/${h.momentum > 0 && h.nesterov}`;
    const recorded = kernel(g);
    noteCaptureCheck(() =>
      kernel(g) === recorded ? null : "SGD's momentum or Nesterov was turned on or off"
    );
    launchSgdUpdatesInto(updates, signals, g);
  }
}
