/**
 * The loss scaler's update rule in plain numbers, written from the docs
 * (PyTorch's GradScaler, with DeepSpeed's hysteresis and min/max clamps), for
 * tests that follow a scaler or a trainer over many steps.
 */
import type { GradScalerOptions } from "../../amp/grad_scaler.ts";

/** Every option of the rule (static `lossScale` 0 = dynamic). */
export type ScalerRule = Required<Omit<GradScalerOptions, "gpu" | "enabled">>;

/** PyTorch's defaults, with hysteresis 1 and the clamps of halfstep's scaler. */
export const DEFAULT_RULE: ScalerRule = {
  initScale: 2 ** 16,
  growthFactor: 2,
  backoffFactor: 0.5,
  growthInterval: 2000,
  hysteresis: 1,
  minScale: 1,
  maxScale: 2 ** 24,
  lossScale: 0,
};

/** The scaler's state, updated by {@link ReferenceScaler.update} once per optimizer step. */
export class ReferenceScaler {
  scale: number;
  growthTracker = 0;
  hysteresisLeft: number;
  skippedSteps = 0;
  lastSkipped = false;
  constructor(readonly o: ScalerRule) {
    this.scale = o.lossScale || o.initScale;
    this.hysteresisLeft = o.hysteresis;
  }
  /** The update after a step whose gradients overflowed (`found`) or not. */
  update(found: boolean): void {
    this.lastSkipped = found;
    if (found) this.skippedSteps++;
    if (this.o.lossScale) return;
    if (found) {
      this.growthTracker = 0;
      this.hysteresisLeft = Math.max(this.hysteresisLeft - 1, 0);
      if (this.hysteresisLeft === 0) {
        this.scale = Math.max(Math.fround(this.scale * this.o.backoffFactor), this.o.minScale);
      }
    } else if (++this.growthTracker === this.o.growthInterval) {
      this.growthTracker = 0;
      this.hysteresisLeft = this.o.hysteresis;
      const grown = Math.fround(this.scale * this.o.growthFactor);
      if (Number.isFinite(grown) && grown <= this.o.maxScale) this.scale = grown;
    }
  }

  /** `update(newScale)` (PyTorch's): the skip is recorded, the scale set, the counters kept. */
  set(newScale: number, found: boolean): void {
    this.lastSkipped = found;
    if (found) this.skippedSteps++;
    this.scale = newScale;
  }
}
