/** Normalisation layers. Their parameters and statistics are always fp32. */
import { batchNorm, type Gpu, layerNorm, ShapeError, Tensor } from "../gpu/mod.ts";
import { Module } from "./module.ts";

/** Options of {@link LayerNorm}. */
export interface LayerNormLayerOptions {
  /** Added to the variance (default 1e-5). */
  eps?: number;
  /** Learnable scale and shift (default true; PyTorch's `elementwise_affine` / `affine`). */
  affine?: boolean;
  /** With `affine`, the shift too (default true; PyTorch's LayerNorm `bias`, nanoGPT's `bias`). */
  bias?: boolean;
  /** Device (default: the one `initGpu()` made). */
  gpu?: Gpu;
}

/**
 * Normalises over the last axis (size `features`) with f32 statistics; f16
 * input gives f16 output. Scale (ones) and shift (zeros) are fp32.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, LayerNorm, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const norm = new LayerNorm(4);
 * const x = Tensor.from([1, 2, 3, 4, 5, 5, 5, 5], [1, 2, 4]); // [batch, tokens, 4]
 * const y = norm.forward(x);
 * const [first, , , last, constant] = await y.read();
 * assert.ok(Math.abs(first + last) < 1e-5, `first ${first}, last ${last}`);
 * assert.equal(constant, 0);
 * gpu.destroy();
 * ```
 */
export class LayerNorm extends Module {
  /** Scale [features], or null. */
  readonly weight: Tensor | null;
  /** Shift [features], or null. */
  readonly bias: Tensor | null;
  /** Added to the variance. */
  readonly eps: number;

  /** A LayerNorm over `features` values. */
  constructor(features: number, options: LayerNormLayerOptions = {}) {
    super();
    const affine = options.affine ?? true, gpu = options.gpu;
    this.weight = affine
      ? this.registerParameter("weight", Tensor.full([features], 1, { gpu }))
      : null;
    this.bias = affine && (options.bias ?? true)
      ? this.registerParameter("bias", Tensor.zeros([features], { gpu }))
      : null;
    this.eps = options.eps ?? 1e-5;
  }

  /** Normalises `x` over its last axis. */
  forward(x: Tensor): Tensor {
    return layerNorm(x, { weight: this.weight, bias: this.bias, eps: this.eps });
  }
}

/** Options of {@link BatchNorm}. */
export interface BatchNormLayerOptions extends Omit<LayerNormLayerOptions, "bias"> {
  /**
   * Weight of each new batch statistic in the running average (default 0.1);
   * `null` for the cumulative average over every batch seen (PyTorch's
   * `momentum=None`).
   */
  momentum?: number | null;
}

/**
 * Batch normalisation over axis 1 of [N, C], [N, C, L] or [N, C, H, W],
 * kept in fp32 always: weight, bias, running mean and running variance are
 * f32, and so is the arithmetic when the input is f16. Training mode uses
 * batch statistics and updates the running ones (PyTorch's rule: momentum
 * 0.1, unbiased variance; `momentum: null` for the cumulative average);
 * eval mode uses the running statistics. Its state dict is PyTorch's:
 * `weight`, `bias`, `running_mean`, `running_var` and `num_batches_tracked`
 * (the training batches seen, counted on the GPU; a state dict without it,
 * as halfstep 0.1 wrote, loads and keeps the current count).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { BatchNorm, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const bn = new BatchNorm(2, { momentum: 0.05 });
 * const h = Tensor.from([1, 10, 3, 30], [2, 2]); // [batch, 2]
 * const y = bn.forward(h); // batch statistics; the running ones move 5% of the way
 * const [runningMean] = await bn.runningMean.read();
 * assert.ok(Math.abs(runningMean - 0.1) < 1e-6, `running mean ${runningMean}`);
 * assert.equal(y.shape.join(), "2,2");
 * gpu.destroy();
 * ```
 */
export class BatchNorm extends Module {
  /** Scale [C], or null. */
  readonly weight: Tensor | null;
  /** Shift [C], or null. */
  readonly bias: Tensor | null;
  /** Running mean [C] (a buffer, saved in the state dict). */
  readonly runningMean: Tensor;
  /** Running unbiased variance [C] (a buffer). */
  readonly runningVar: Tensor;
  /** Training batches seen, i32 [] (a buffer; PyTorch's `num_batches_tracked`). */
  readonly numBatchesTracked: Tensor;
  /** Weight of each new batch statistic, or null for the cumulative average. */
  momentum: number | null;
  /** Added to the variance. */
  readonly eps: number;
  /**
   * When false, a training-mode forward leaves the running statistics alone
   * (gradient checkpointing sets it while recomputing).
   */
  updateRunningStats = true;

  /** A BatchNorm over `channels` channels. */
  constructor(channels: number, options: BatchNormLayerOptions = {}) {
    super();
    const affine = options.affine ?? true, gpu = options.gpu;
    this.weight = affine
      ? this.registerParameter("weight", Tensor.full([channels], 1, { gpu }))
      : null;
    this.bias = affine ? this.registerParameter("bias", Tensor.zeros([channels], { gpu })) : null;
    this.runningMean = this.registerBuffer("running_mean", Tensor.zeros([channels], { gpu }));
    this.runningVar = this.registerBuffer("running_var", Tensor.full([channels], 1, { gpu }));
    this.numBatchesTracked = this.registerBuffer(
      "num_batches_tracked",
      Tensor.zeros([], { dtype: "i32", gpu }),
      { optionalOnLoad: true },
    );
    this.momentum = options.momentum === undefined ? 0.1 : options.momentum;
    this.eps = options.eps ?? 1e-5;
  }

  /** Normalises `x` per channel. */
  forward(x: Tensor): Tensor {
    return batchNorm(x, {
      weight: this.weight,
      bias: this.bias,
      runningMean: this.runningMean,
      runningVar: this.runningVar,
      numBatchesTracked: this.numBatchesTracked,
      training: this.training,
      momentum: this.momentum,
      eps: this.eps,
      updateRunningStats: this.updateRunningStats,
    });
  }
}

/** BatchNorm for [N, C] or [N, C, L] inputs (PyTorch's name). */
export class BatchNorm1d extends BatchNorm {
  /** Checks the rank, then normalises. */
  override forward(x: Tensor): Tensor {
    if (x.rank !== 2 && x.rank !== 3) {
      throw new ShapeError(`BatchNorm1d: input ${x.describe()} must be [N, C] or [N, C, L].`);
    }
    return super.forward(x);
  }
}

/** BatchNorm for [N, C, H, W] inputs (PyTorch's name). */
export class BatchNorm2d extends BatchNorm {
  /** Checks the rank, then normalises. */
  override forward(x: Tensor): Tensor {
    if (x.rank !== 4) {
      throw new ShapeError(`BatchNorm2d: input ${x.describe()} must be [N, C, H, W].`);
    }
    return super.forward(x);
  }
}
