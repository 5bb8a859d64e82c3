/**
 * The matmul family's tuning settings on one device: the tiling of each
 * tuned class (which `tuneMatmul` fills and dispatch reads), the tiling of
 * every other class, and the split-K target. The device keeps only facts
 * about the adapter; these are what the matmul tuner chose (see gpu/tuners.ts).
 */
import type { MatmulTiling } from "./device.ts";
import { DEFAULT_TILING } from "./matmul_candidates.ts";
import { defineTunerSettings, type TunerSettings } from "./tuners.ts";

/** What matmul dispatch reads on one device (see {@link matmulSettings}). */
export interface MatmulSettings {
  /**
   * The tiling of classes not in {@link MatmulSettings.classTilings}: the
   * one `initGpu({ matmulTiling })` was given, else `DEFAULT_TILING`. Tests
   * set it (with `classTilings` empty) to force a candidate.
   */
  tiling: MatmulTiling;
  /**
   * The tuned tiling of each matmul class, by class key (`"f16/nt/medium"`:
   * dtype / orientation / size); `tuneMatmul` fills it, dispatch reads it.
   */
  readonly classTilings: Map<string, MatmulTiling>;
  /**
   * Split-K: a product (or a convolution's weight gradient) whose result
   * gives fewer workgroup tiles than this splits its reduction into slices
   * summed by workgroups of their own, until about this many run (slices of
   * at least 256, at most 64; see `gemmSlices` in `gpu/kernels/gemm.ts`).
   * The partial sums are f32 and added in a fixed order, so a run repeats
   * bit for bit. 0 never splits, except where a slice would pass lavapipe's
   * loop cap. Per-shape picks on GPUs choose their own slice counts.
   */
  splitKWorkgroups: number;
}

/**
 * The matmul settings of a device (`matmulSettings.of(gpu)`). Split-K aims
 * at 256 workgroups on GPUs (an H100 runs 132 multiprocessors, and a weight
 * gradient such as the GPT's fc1 gᵀ·x makes only 36 tiles of 128×128) and
 * at 4 per CPU thread on CPU adapters: lavapipe runs a workgroup on one
 * thread, so more slices only add partial sums (a 512³ product split in two
 * ran up to 20% slower there).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "./mod.ts";
 * import { matmulSettings } from "./matmul_settings.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.equal(matmulSettings.of(gpu).classTilings.size, 0, "nothing tuned");
 * gpu.destroy();
 * ```
 */
export const matmulSettings: TunerSettings<MatmulSettings> = defineTunerSettings(
  "matmul",
  (gpu) => ({
    tiling: DEFAULT_TILING,
    classTilings: new Map(),
    splitKWorkgroups: gpu.adapterProfile.cpu ? 4 * navigator.hardwareConcurrency : 256,
  }),
);
