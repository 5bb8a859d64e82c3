/** Clipping by global norm, computed in f32 on the GPU with no readback. */
import { noGrad, Tensor, untracked, ValueError } from "../gpu/mod.ts";
import {
  launchClipCoefficientInto,
  launchScaleByCoefficientInto,
  launchSumSquaresInto,
  sumSquaresSlots,
} from "./kernels/clip.ts";

/** What {@link clipGradNorm} leaves on the GPU. */
export interface ClipResult {
  /** f32 [1]: the global L2 norm of the gradients before clipping. */
  totalNorm: Tensor;
  /** f32 [1]: min(1, maxNorm / (norm + 1e-6)), the factor the gradients were (or are to be) scaled by. */
  coefficient: Tensor;
}

/** Options of {@link clipGradNorm}. */
export interface ClipOptions {
  /** Scale the gradients in place (default true); false computes the coefficient only. */
  inPlace?: boolean;
  /**
   * f32 [1]: the gradients as stored are still to be multiplied by it (a
   * loss scale's inverse that the fused update applies, as
   * `GradScaler.unscale(optimizer, { inPlace: false })` leaves them, for f16
   * gradients): the norm is then that of the unscaled gradients, computed in
   * f32 (Σ g² of the stored values, times it). The coefficient stays the clip
   * factor alone; in place, the gradients stay scaled by it.
   */
  gradScale?: Tensor;
}

/**
 * Clips the gradients of `params` by their global L2 norm, like PyTorch's
 * `clip_grad_norm_`. Run it on unscaled gradients (after
 * `GradScaler.unscale`). By default the gradients are scaled in place; with
 * `{ inPlace: false }` only the coefficient is computed, for an optimizer to
 * apply inside its fused kernel (`step({ gradScale: coefficient })`).
 * Nothing waits for the GPU; read `totalNorm` only when you want to log it.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { clipGradNorm, initGpu, mul, sum, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const w = Tensor.from([3, 4], [2], { requiresGrad: true });
 * sum(mul(w, w)).backward(); // grad 2w = [6, 8]: norm 10
 * // In AMP training: scaler.unscale(optimizer), clip, then scaler.step(optimizer).
 * const { totalNorm } = clipGradNorm([w], 1.0); // scales the gradients in place
 * const [g0, g1] = await w.grad!.read();
 * assert.equal(await totalNorm.item(), 10);
 * // [6, 8] / 10
 * assert.ok(Math.abs(g0 - 0.6) < 1e-5 && Math.abs(g1 - 0.8) < 1e-5, `gradient ${[g0, g1]}`);
 * gpu.destroy();
 * ```
 */
export function clipGradNorm(
  params: readonly Tensor[],
  maxNorm: number,
  options: ClipOptions = {},
): ClipResult {
  if (!(maxNorm > 0) || !Number.isFinite(maxNorm)) {
    throw new ValueError(`clipGradNorm: maxNorm must be a positive finite number, got ${maxNorm}.`);
  }
  // A gradient listed twice (a parameter given twice) counts, and is scaled, once.
  const grads = [...new Set(params.map((p) => p.grad).filter((g): g is Tensor => g !== null))];
  const gpu = params[0]?.gpu;
  if (!gpu) throw new ValueError("clipGradNorm: no parameters given.");
  return untracked(() =>
    noGrad(() => {
      const slots = grads.reduce((total, g) => total + sumSquaresSlots(g.size), 0);
      const partials = Tensor.empty([Math.max(slots, 1)], "f32", gpu); // every slot is written
      launchSumSquaresInto(grads, partials);
      const totalNorm = Tensor.empty([1], "f32", gpu), coefficient = Tensor.empty([1], "f32", gpu);
      launchClipCoefficientInto(
        partials,
        slots,
        maxNorm,
        totalNorm,
        coefficient,
        options.gradScale,
      );
      partials.dispose();
      if (options.inPlace ?? true) launchScaleByCoefficientInto(grads, coefficient);
      return { totalNorm, coefficient };
    })
  );
}
