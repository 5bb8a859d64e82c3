/**
 * fp32 master weights and their f16 working copies. Parameters stay fp32;
 * each gets one f16 copy that f16 ops read under autocast. The copy is
 * written once per optimizer step by the fused update kernel (and once here
 * at the start), never per op or per micro-batch.
 */
import { record } from "../gpu/autograd.ts";
import { GpuError } from "../gpu/device.ts";
import { launchUnary } from "../gpu/kernels/elementwise.ts";
import { untracked } from "../gpu/scope.ts";
import type { Tensor } from "../gpu/tensor.ts";

/** Working copy of each registered master, for the autocast hook. */
const copies = new WeakMap<Tensor, Tensor>();

/** The f16 working copy of `master`, or undefined when it has none. */
export function workingCopyOf(master: Tensor): Tensor | undefined {
  const copy = copies.get(master);
  return copy && !copy.disposed ? copy : undefined;
}

/**
 * `master` as an f16 tensor for an f16 op: its working copy, recorded on the
 * tape as a cast so the f16 gradient lands, cast up, in the fp32 master's
 * `.grad` (accumulated +=). Undefined when `master` has no working copy.
 */
export function readWorkingCopy(master: Tensor): Tensor | undefined {
  const copy = workingCopyOf(master);
  if (!copy) return undefined;
  return record(
    "cast",
    [master],
    copy.share(),
    (g) => [launchUnary("identity", g, { out: "f32" })],
  );
}

/**
 * f16 working copies for a set of fp32 parameters.
 *
 * @example
 * ```ts
 * import { FusedSGD, initGpu, MasterWeights, sum, Tensor, workingCopyOf } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const w = Tensor.from([1, 2], [2], { requiresGrad: true }); // an fp32 master
 * const masters = new MasterWeights([w]);
 * const optimizer = new FusedSGD([w], { lr: 0.5 });
 * optimizer.setWorkingCopies(masters.copies); // the fused step refreshes them
 * sum(w).backward();
 * optimizer.step();
 * console.assert((await workingCopyOf(w)!.read()).join() === "0.5,1.5"); // the f16 copy
 * gpu.destroy();
 * ```
 */
export class MasterWeights {
  /** master → f16 working copy. */
  readonly copies: ReadonlyMap<Tensor, Tensor>;

  /** Makes (and fills) a working copy for every f32 parameter in `params`. */
  constructor(params: readonly Tensor[]) {
    const map = new Map<Tensor, Tensor>();
    for (const p of params) {
      if (p.dtype !== "f32") {
        throw new GpuError(
          `MasterWeights: parameter ${p.describe()} is not f32; master weights are fp32 ` +
            "(create layers with the default dtype and let autocast run them in f16).",
        );
      }
      if (!p.gpu.f16) continue; // no shader-f16: everything runs in f32
      const copy = untracked(() => launchUnary("identity", p, { out: "f16" }));
      map.set(p, copy);
      copies.set(p, copy);
    }
    this.copies = map;
  }

  /** Rewrites every copy from its master (after loading a checkpoint into the masters). */
  refresh(): void {
    for (const [master, copy] of this.copies) {
      const fresh = launchUnary("identity", master, { out: "f16" });
      copy.copyFrom(fresh);
      fresh.dispose();
    }
  }

  /** Frees the copies; f16 ops then cast the masters themselves. */
  dispose(): void {
    for (const [master, copy] of this.copies) {
      copies.delete(master);
      copy.dispose();
    }
  }
}
