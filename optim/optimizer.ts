/**
 * What the training machinery needs from an optimizer. Loss scaling and
 * gradient clipping talk to optimizers only through this interface (as
 * PyTorch's GradScaler works with any `torch.optim` optimizer), and every
 * signal they send lives in a GPU buffer: nothing here reads back to the CPU,
 * so a skipped step is decided on the GPU.
 */
import type { Tensor } from "../gpu/mod.ts";

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

/**
 * Lower-precision working copies of fp32 master parameters, owned elsewhere
 * (amp's `MasterWeights`): an optimizer writes each copy after updating its
 * master, so f16 ops never cast weights themselves.
 */
export interface WorkingCopies {
  /** The masters that have a copy. */
  readonly masters: readonly Tensor[];
  /** The live copy of `master`, or undefined when it has none (or it was freed). */
  copyOf(master: Tensor): Tensor | undefined;
}

/** An optimizer over fp32 master parameters whose update kernels honour {@link StepSignals}. */
export interface Optimizer {
  /** The fp32 master parameters, each with its `.grad` after backward. */
  readonly params: readonly Tensor[];
  /** One update of every parameter that has a gradient. Records nothing on the tape; no sync. */
  step(signals?: StepSignals): void;
  /** Frees every gradient. */
  zeroGrad(): void;
  /**
   * Registers working copies: after each (not skipped) update the new value
   * of a master is written into its copy. The optimizer keeps a reference to
   * `copies`, not a copy of the links: their owner stays the only one.
   */
  setWorkingCopies(copies: WorkingCopies | null): void;
}
