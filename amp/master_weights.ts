/**
 * fp32 master weights and their f16 (or bf16) working copies. Parameters stay
 * fp32; each gets one copy that low-precision ops read under autocast. The copy is
 * written once per optimizer step by the fused update kernel (and once here
 * at the start), never per op or per micro-batch. `MasterWeights` is the only
 * owner of the master → copy links: the optimizer and the autocast hook hold
 * a reference to it, not copies of its map.
 */
import {
  DTypeError,
  fail,
  readThroughCopy,
  type Tensor,
  untracked,
  workingCopy,
} from "../gpu/mod.ts";
import type { WorkingCopies } from "../optim/optimizer.ts";
import { type AmpDType, ampDType } from "./amp_dtype.ts";

/** Options of {@link MasterWeights}. */
export interface MasterWeightsOptions {
  /** The working copies' dtype: "f16" (default; none without shader-f16) or "bf16". */
  dtype?: AmpDType;
}

/**
 * f16 (or bf16) working copies for a set of fp32 parameters.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { autocast, initGpu, linear, MasterWeights, SGD, sum, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const w = Tensor.from([1, 2], [1, 2], { requiresGrad: true }); // an fp32 master
 * const masterWeights = new MasterWeights([w]);
 * const optimizer = new SGD([w], { lr: 0.5 });
 * optimizer.setWorkingCopies(masterWeights); // the fused step refreshes the copies
 * const x = Tensor.from([1, 1], [1, 2]);
 * autocast(() => sum(linear(x, w)), { masterWeights }).backward(); // reads the copy
 * optimizer.step();
 * assert.equal((await masterWeights.copyOf(w)!.read()).join(), "0.5,1.5");
 * const bf16 = new MasterWeights([w], { dtype: "bf16" }); // needs no shader-f16
 * assert.equal(bf16.copyOf(w)!.dtype, "bf16");
 * gpu.destroy();
 * ```
 */
export class MasterWeights implements WorkingCopies {
  /** The working copies' dtype. */
  readonly dtype: AmpDType;
  #copies = new Map<Tensor, Tensor>();

  /**
   * Makes (and fills) a working copy for every f32 parameter in `params`:
   * f16 ones only where the device has shader-f16 (else none: f32 runs).
   */
  constructor(params: readonly Tensor[], options: MasterWeightsOptions = {}) {
    const dtype = this.dtype = ampDType("MasterWeights", options.dtype);
    for (const p of params) {
      if (p.dtype !== "f32") {
        fail(
          DTypeError,
          "MasterWeights",
          `parameter ${p.describe()} is not f32; master weights are fp32 ` +
            `(create layers with the default dtype and let autocast run them in ${dtype}).`,
        );
      }
      if (dtype === "f16" && !p.gpu.f16) continue; // no shader-f16: everything runs in f32
      this.#copies.set(p, untracked(() => workingCopy(p, dtype)));
    }
  }

  /** The masters that have a working copy. */
  get masters(): Tensor[] {
    return [...this.#copies.keys()];
  }

  /** The working copy of `master`, or undefined when it has none (or it was freed). */
  copyOf(master: Tensor): Tensor | undefined {
    const copy = this.#copies.get(master);
    return copy && !copy.disposed ? copy : undefined;
  }

  /**
   * `master` as a low-precision tensor for a low-precision op: its working
   * copy, recorded on the tape as a cast so the copy's gradient lands, cast
   * up, in the fp32 master's `.grad` (accumulated +=). Undefined when
   * `master` has no working copy, or its copy is not of `dtype` (when given).
   */
  readWorkingCopy(master: Tensor, dtype: AmpDType = this.dtype): Tensor | undefined {
    const copy = this.copyOf(master);
    if (!copy || copy.dtype !== dtype) return undefined;
    return readThroughCopy(master, copy);
  }

  /** Rewrites every copy from its master (after loading saved weights into the masters). */
  refresh(): void {
    for (const [master, copy] of this.#copies) {
      const fresh = workingCopy(master, this.dtype);
      copy.copyFrom(fresh);
      fresh.dispose();
    }
  }

  /** Frees the copies; low-precision ops then cast the masters themselves. */
  dispose(): void {
    for (const copy of this.#copies.values()) copy.dispose();
    this.#copies.clear();
  }
}
