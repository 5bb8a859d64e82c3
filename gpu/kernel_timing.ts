/**
 * What the kernel tuners share: timing a run of dispatches, and the
 * per-adapter cache of their winners.
 */
import type { Gpu } from "./device.ts";
import { GpuError } from "./errors.ts";
import { f16MatrixConfig } from "./subgroup_matrix_configs.ts";

/**
 * Seconds per call of `run` (which records dispatches): GPU timestamps where
 * the adapter has them, else wall time over enough repeats that the wait
 * (~11 ms in Deno) is a small part. Runs it once first to compile and warm up.
 * A candidate whose kernel fails on this adapter (a subgroup-matrix tiling
 * its driver rejects: those are designed without a GPU at hand) takes
 * Infinity, so it is never picked; a lost device still stops the tuner.
 */
export async function secondsPerRun(gpu: Gpu, run: () => void): Promise<number> {
  try {
    return await timeRuns(gpu, run);
  } catch (e) {
    gpu.throwIfFailed();
    if (e instanceof GpuError) return Infinity;
    throw e;
  }
}

async function timeRuns(gpu: Gpu, run: () => void): Promise<number> {
  run();
  await gpu.sync();
  if (gpu.device.features.has("timestamp-query")) {
    const report = await gpu.profile(() => {
      for (let r = 0; r < 3; r++) run();
    }, { print: false });
    return report.gpuMs / 3 / 1000;
  }
  let repeats = 1;
  for (;;) {
    const start = performance.now();
    for (let r = 0; r < repeats; r++) run();
    await gpu.sync();
    const ms = performance.now() - start;
    if (ms >= 100 || repeats >= 256) return ms / repeats / 1000;
    repeats *= 4;
  }
}

/**
 * Seconds per run of each candidate, timed by `time`, and the fastest. On a
 * shared or noisy machine one timing can misrank close candidates (a tuner
 * picked a tiling 45% slower than the best that way), so the `finalists`
 * fastest of the first round are timed again, in reverse order, and each
 * keeps its better time.
 */
export async function timeCandidates<T>(
  candidates: readonly T[],
  time: (candidate: T) => Promise<number>,
  finalists = 3,
): Promise<{ best: T; seconds: number[] }> {
  const seconds: number[] = [];
  for (const c of candidates) seconds.push(await time(c));
  const ranked = candidates.map((_, i) => i).sort((a, b) => seconds[a] - seconds[b]);
  for (const i of ranked.slice(0, finalists).reverse()) {
    seconds[i] = Math.min(seconds[i], await time(candidates[i]));
  }
  const best = seconds.reduce((b, x, i) => (x < seconds[b] ? i : b), 0);
  return { best: candidates[best], seconds };
}

/**
 * The cache key of `tuner`'s winners (version `version`) on `gpu`: by
 * adapter, by profile when a test runs the device as another adapter
 * (`withAdapterProfile`), so its winners never mix with the real ones, and by
 * the subgroup-matrix shape its device may use: one adapter through Dawn
 * has candidates that it lacks through Deno's WebGPU, so winners picked
 * without them are not reused where they exist.
 */
export function tunerCacheKey(gpu: Gpu, tuner: string, version: number): string {
  const profile = gpu.adapterProfile.name === "adapter" ? "" : ` [${gpu.adapterProfile.name}]`;
  const c = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);
  const matrices = c ? ` [subgroup-matrix ${c.M}x${c.N}x${c.K}]` : "";
  return `halfstep.${tuner}.v${version}:${gpu.adapterName}${profile}${matrices}`;
}

/**
 * Times one run of a candidate: seconds per call of `run`, which records the
 * candidate's dispatches. The tuners default to {@link secondsPerRun}; tests
 * inject their own to check what the tuner does with the figures.
 */
export type CandidateTimer<T> = (candidate: T, run: () => void) => Promise<number>;

/** `localStorage` where the runtime offers it (Deno, browsers), else null: winners are then not kept. */
function tuningStorage(): Storage | null {
  try {
    return typeof localStorage === "undefined" ? null : localStorage;
  } catch {
    return null;
  }
}

/**
 * A tuner's winners for one adapter, kept in `localStorage` under `key` (which
 * names the tuner, its version and the adapter). `known` maps a stored value
 * back to a current candidate, or undefined: entries of older candidates, and
 * a corrupt cache, are measured again.
 */
export function winnerCache<T>(key: string, known: (stored: unknown) => T | undefined) {
  const read = (): Record<string, T> => {
    try {
      const parsed = JSON.parse(tuningStorage()?.getItem(key) ?? "{}");
      const entries = Object.entries(parsed).map(([k, v]) => [k, known(v)] as const);
      return Object.fromEntries(entries.filter(([, v]) => v !== undefined)) as Record<string, T>;
    } catch {
      return {};
    }
  };
  return {
    read,
    /** Adds `winners` to what is stored (other keys are kept). */
    write(winners: ReadonlyMap<string, T>): void {
      tuningStorage()?.setItem(key, JSON.stringify({ ...read(), ...Object.fromEntries(winners) }));
    },
  };
}

/**
 * Progress of a tuning run: `done` of `total` measurements made for `task`
 * (only those the cache did not hold). Called with `done` 0 before the first.
 */
export interface TuningProgress {
  /** What is measured, e.g. `"matmul tilings"`. */
  task: string;
  /** Measurements finished. */
  done: number;
  /** Measurements this run makes. */
  total: number;
}

/** Calls `report` before the first of `total` measurements and after each; returns the "after". */
export function progressReporter(
  task: string,
  total: number,
  report?: (progress: TuningProgress) => void,
): () => void {
  let done = 0;
  if (report && total > 0) report({ task, done, total });
  return () => report?.({ task, done: ++done, total });
}
