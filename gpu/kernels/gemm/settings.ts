/**
 * The matmul family's tuning settings on one device: the tiling of each
 * tuned class (which `tuneMatmul` fills and dispatch reads), the tiling of
 * every other class, and the split-K target. The device keeps only facts
 * about the adapter; these are what the matmul tuner chose (see gpu/tuning/settings.ts).
 */
import { defineTunerSettings, type TunerSettings } from "../../tuning/settings.ts";

/** Per-thread and per-workgroup tile sizes of the matmul kernel. */
export interface MatmulTiling extends Record<string, string | number | boolean> {
  /**
   * `"register"`: each thread keeps a contiguous TM×TN block in registers,
   * loading from storage; `"interleaved"`: the same with the thread's rows and
   * columns strided across the workgroup, so neighbouring threads load
   * neighbouring addresses (both suit CPU adapters); `"shared"`: workgroup
   * shared-memory tiles; `"blocked"`: large shared tiles read as vec4
   * (written for GPUs; TM and TN multiples of 4); `"vec4"`: the blocked
   * tiles loaded from storage as vec4 with the next k-tile prefetched
   * (matmul on GPUs; TM, TN and TK multiples of 4); `"subgroup-matrix"`: f16
   * products on the adapter's subgroup matrices (tensor cores, through Dawn;
   * per subgroup instead of per thread below, with the config's sizes in `sm`,
   * `sn`, `sk` and the subgroup size in `sg`; see
   * `gpu/kernels/gemm/gemm_subgroup_matrix.ts`). See `gpu/kernels/gemm/tilings.ts`.
   */
  variant: "register" | "interleaved" | "shared" | "blocked" | "vec4" | "subgroup-matrix";
  /** Output rows per thread (subgroup-matrix: per subgroup). */
  tm: number;
  /** Output columns per thread (subgroup-matrix: per subgroup). */
  tn: number;
  /** Workgroup threads along columns (subgroup-matrix: subgroups). */
  wgx: number;
  /** Workgroup threads along rows (subgroup-matrix: subgroups). */
  wgy: number;
  /** K-slice staged per shared-memory step (shared, blocked and vec4 variants). */
  tk: number;
}

/** The tiling used before (or instead of) a search: the first CPU candidate. */
export const DEFAULT_TILING: MatmulTiling = {
  variant: "register",
  tm: 4,
  tn: 4,
  wgx: 8,
  wgy: 8,
  tk: 1,
};

/**
 * How f16 matmuls sum their products: `"f32"`: every product is added into
 * an f32 accumulator; `"chunked"`: products of each run of `F16_CHUNK`
 * consecutive k are summed in f16 (vec4<f16> FMAs) and each run's sum is
 * added into f32, as PyTorch's `allow_fp16_reduced_precision_reduction`
 * permits. Only the GPU tiling (`blocked`) has the chunked form; the CPU
 * tilings always sum in f32.
 */
export type F16Accumulation = "f32" | "chunked";

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
   * at least 256, at most 64; see `gemmSlices` in `gpu/kernels/gemm/gemm.ts`).
   * The partial sums are f32 and added in a fixed order, so a run repeats
   * bit for bit. 0 never splits, except where a slice would pass lavapipe's
   * loop cap. Per-shape picks on GPUs choose their own slice counts.
   */
  splitKWorkgroups: number;
  /**
   * How f16 matmuls sum their products (see {@link F16Accumulation}): what
   * `initGpu({ f16Accumulation })` was given, else `"f32"`; tests switch it.
   */
  f16Accumulation: F16Accumulation;
}

/**
 * The matmul settings of a device (`matmulSettings.of(gpu)`). Split-K aims
 * at 256 workgroups on GPUs (a couple of waves of a large GPU's
 * multiprocessors, where a weight gradient may make only a few dozen big
 * tiles) and at 4 per CPU thread on CPU adapters: lavapipe runs a workgroup
 * on one thread, so more slices only add partial sums.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../../mod.ts";
 * import { matmulSettings } from "./settings.ts";
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
    f16Accumulation: "f32",
  }),
);
