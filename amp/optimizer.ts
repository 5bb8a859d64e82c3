/**
 * What the mixed-precision machinery needs from an optimizer. The GradScaler
 * and gradient clipping talk to optimizers only through this interface, and
 * every signal they send lives in a GPU buffer: nothing here reads back to
 * the CPU, so a skipped step is decided on the GPU.
 */
import type { Tensor } from "../gpu/tensor.ts";

/** GPU-resident signals for one optimizer step. */
export interface StepSignals {
  /**
   * f32 [1]. When its value is non-zero the step is skipped on the GPU:
   * parameters, working copies and optimizer state stay bit-identical.
   */
  foundInf?: Tensor;
  /**
   * f32 [1]. Gradients are multiplied by this value before use (the
   * clip-by-global-norm coefficient); 1 when absent.
   */
  gradScale?: Tensor;
}

/** An optimizer over fp32 master parameters whose update kernels honour {@link StepSignals}. */
export interface AmpOptimizer {
  /** The fp32 master parameters, each with its `.grad` after backward. */
  readonly params: readonly Tensor[];
  /** One update of every parameter that has a gradient. Records nothing on the tape; no sync. */
  step(signals?: StepSignals): void;
  /** Frees every gradient. */
  zeroGrad(): void;
  /**
   * Registers f16 working copies: after each (not skipped) update the fused
   * kernel writes the new value of `master` into `copy`, so f16 ops never
   * cast weights themselves.
   */
  setWorkingCopies(copies: ReadonlyMap<Tensor, Tensor>): void;
}
