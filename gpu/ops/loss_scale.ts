/**
 * The two ops mixed precision adds to the tape, here with every other op so
 * that whatever watches the tape (the op observer, the registry test) sees
 * them: the loss times a scale that lives on the GPU, and a tensor read
 * through a copy of it in another dtype that is kept up to date elsewhere (an
 * fp32 master's f16 working copy).
 */
import { record } from "../tensor/autograd.ts";
import { launchBinary, launchUnary } from "../kernels/elementwise.ts";
import type { DType } from "../base/dtype.ts";
import { gradDtypeOf, Tensor } from "../tensor/tensor.ts";

/**
 * `loss × scale`, `scale` a one-element f32 tensor read on the GPU when the
 * kernel runs (so a scale the GPU itself updates needs no readback); backward
 * multiplies the incoming gradient by the same tensor, as read at backward
 * time. The caller checks dtypes and devices.
 *
 * @param loss The f32 loss (any shape: every element is multiplied).
 * @param scale A one-element f32 tensor.
 * @returns The scaled loss, on the tape as `loss_scale`.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Tensor } from "../../mod.ts";
 * import { scaleLoss } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const loss = Tensor.from([0.5], [1], { requiresGrad: true });
 * const scaled = scaleLoss(loss, Tensor.from([1024], [1]));
 * scaled.backward();
 * assert.equal((await scaled.read())[0], 512);
 * assert.equal((await loss.grad!.read())[0], 1024);
 * gpu.destroy();
 * ```
 */
export function scaleLoss(loss: Tensor, scale: Tensor): Tensor {
  const all = (t: Tensor) => ({ mid: t.size, inner: 1 }); // every element reads scale[0]
  return record({
    op: "loss_scale",
    inputs: [loss],
    output: Tensor.adopt(launchBinary("mul", loss, scale, all(loss))),
    save: [scale],
    backward: (g, [s]) => [Tensor.adopt(launchBinary("mul", g, s, all(g)))],
  });
}

/**
 * `source` read through `copy`, a copy of it in another dtype that someone
 * else keeps up to date (no cast is dispatched): recorded as a `cast`, so the
 * gradient reaching the copy lands, cast to `source`'s dtype (or to its
 * `gradDtype`, passed on as it is when that is the copy's), in
 * `source.grad`. The caller owns `copy`; the result shares its memory.
 *
 * @param source The tensor the gradient belongs to (an fp32 master weight).
 * @param copy Its current copy in another dtype (the f16 working copy).
 * @returns A handle on `copy`'s memory, on the tape as a cast of `source`.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, sum, Tensor } from "../../mod.ts";
 * import { readThroughCopy } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const master = Tensor.from([1, 2], [2], { requiresGrad: true });
 * const copy = Tensor.from([1, 2], [2], { dtype: gpu.f16 ? "f16" : "f32" });
 * sum(readThroughCopy(master, copy)).backward();
 * assert.equal((await master.grad!.read()).join(), "1,1");
 * assert.equal(master.grad!.dtype, "f32");
 * gpu.destroy();
 * ```
 */
export function readThroughCopy(source: Tensor, copy: Tensor): Tensor {
  return record({
    op: "cast",
    inputs: [source],
    output: copy.share(),
    // The copy's gradient lands in the dtype the source keeps its gradient in: cast up to an
    // fp32 master's f32, or passed on as it is to a master that keeps it in f16 (apex O2).
    backward: (g) => [
      g.dtype === gradDtypeOf(source)
        ? g
        : Tensor.adopt(launchUnary("identity", g, { out: gradDtypeOf(source) })),
    ],
  });
}

/**
 * A copy of `source` in `dtype`, off the tape and unseen by an op observer:
 * how a master weight's working copy is made and refreshed (the gradient
 * reaches the master through {@link readThroughCopy}, not through this).
 */
export function workingCopy(source: Tensor, dtype: DType): Tensor {
  return Tensor.adopt(launchUnary("identity", source, { out: dtype }));
}
