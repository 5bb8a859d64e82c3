/**
 * Picks the matmul tiling for an adapter by a short measured search. What is
 * fastest differs by adapter: on CPU adapters (lavapipe) large per-thread
 * register blocks win and shared-memory tiles lose; on real GPUs it is the
 * other way round. The winner is cached per adapter in `localStorage` when
 * the runtime offers it.
 */
import type { Gpu, MatmulTiling } from "./device.ts";
import { dispatchMatmul } from "./kernels/matmul.ts";
import { Tensor } from "./tensor.ts";
import { untracked } from "./scope.ts";

/** The tilings the search tries, register blocks first. */
export const MATMUL_CANDIDATES: readonly MatmulTiling[] = [
  { variant: "register", tm: 4, tn: 4, wgx: 8, wgy: 8, tk: 1 },
  { variant: "register", tm: 8, tn: 8, wgx: 8, wgy: 4, tk: 1 },
  { variant: "register", tm: 8, tn: 16, wgx: 4, wgy: 4, tk: 1 },
  { variant: "register", tm: 16, tn: 16, wgx: 2, wgy: 4, tk: 1 },
  { variant: "interleaved", tm: 4, tn: 4, wgx: 8, wgy: 8, tk: 1 },
  { variant: "interleaved", tm: 8, tn: 8, wgx: 8, wgy: 4, tk: 1 },
  { variant: "interleaved", tm: 8, tn: 4, wgx: 8, wgy: 8, tk: 1 },
  { variant: "interleaved", tm: 16, tn: 4, wgx: 8, wgy: 2, tk: 1 },
  { variant: "shared", tm: 4, tn: 4, wgx: 16, wgy: 16, tk: 16 },
  { variant: "shared", tm: 8, tn: 8, wgx: 8, wgy: 8, tk: 8 },
];

/** The tiling used before (or instead of) a search. */
export const DEFAULT_TILING: MatmulTiling = MATMUL_CANDIDATES[0];

/** One candidate's measured speed. */
export interface TilingMeasurement {
  /** The candidate. */
  tiling: MatmulTiling;
  /** Its speed on the tuning problem, in GFLOP/s. */
  gflops: number;
}

/** Result of a search: the winner and every measurement. */
export interface TuningResult {
  /** The fastest candidate. */
  best: MatmulTiling;
  /** Every candidate's speed (empty when the winner came from the cache). */
  measurements: TilingMeasurement[];
  /** True when the winner was read from the per-adapter cache instead of measured. */
  cached: boolean;
}

const SHAPE = { m: 256, n: 512, k: 512 };
const REPEATS = 3;

function cacheKey(gpu: Gpu): string {
  return `halfstep.matmulTiling.v1:${gpu.adapterName}`;
}

function storage(): Storage | null {
  try {
    return typeof localStorage === "undefined" ? null : localStorage;
  } catch {
    return null;
  }
}

/**
 * Times every candidate on a 256×512×512 f32 product and returns the fastest.
 * Uses the cached winner for this adapter unless `force` is set. Syncs with
 * the GPU a few times per candidate: call it once at start-up, never per step.
 */
export async function tuneMatmul(gpu: Gpu, force = false): Promise<TuningResult> {
  const store = storage();
  const cached = force ? null : store?.getItem(cacheKey(gpu));
  if (cached) {
    const best = MATMUL_CANDIDATES.find((c) => JSON.stringify(c) === cached);
    if (best) return { best, measurements: [], cached: true };
  }
  const { m, n, k } = SHAPE;
  const [a, b, c] = untracked(() => [
    Tensor.zeros([m, k], { gpu }),
    Tensor.zeros([k, n], { gpu }),
    Tensor.empty([m, n], "f32", gpu),
  ]);
  const problem = {
    batch: 1,
    m,
    n,
    k,
    a: { batch: 0, row: k, col: 1 },
    b: { batch: 0, row: n, col: 1 },
  };
  const measurements: TilingMeasurement[] = [];
  try {
    for (const tiling of MATMUL_CANDIDATES) {
      dispatchMatmul(problem, a, b, c, {}, tiling); // compile and warm up
      await gpu.sync();
      const start = performance.now();
      for (let r = 0; r < REPEATS; r++) dispatchMatmul(problem, a, b, c, {}, tiling);
      await gpu.sync();
      const seconds = (performance.now() - start) / 1000;
      measurements.push({ tiling, gflops: (2 * m * n * k * REPEATS) / seconds / 1e9 });
    }
  } finally {
    a.dispose();
    b.dispose();
    c.dispose();
  }
  const best = measurements.reduce((x, y) => (y.gflops > x.gflops ? y : x)).tiling;
  store?.setItem(cacheKey(gpu), JSON.stringify(best));
  return { best, measurements, cached: false };
}
