/**
 * How the kernel tuners time: a run of dispatches (GPU timestamps, else wall
 * time), candidates with their finalists timed again, and progress reports.
 */
import type { Gpu } from "../device/gpu.ts";
import { GpuError } from "../base/errors.ts";

/**
 * Seconds per call of `run` (which records dispatches): GPU timestamps where
 * the adapter has them, else wall time over enough repeats that the wait
 * for the GPU is a small part. Runs it once first to compile and warm up.
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
 * Times `seconds`' `finalists` fastest entries again, slowest of them first,
 * each keeping its better time (`time(i)` times entry i once more): on a
 * shared or noisy machine one timing can misrank close candidates. The one
 * rule every tuner follows; returns how many timings it made.
 */
export async function retimeFinalists(
  seconds: number[],
  time: (index: number) => Promise<number>,
  finalists = 3,
): Promise<number> {
  const ranked = seconds.map((_, i) => i).sort((a, b) => seconds[a] - seconds[b]);
  const again = ranked.slice(0, finalists).reverse();
  for (const i of again) seconds[i] = Math.min(seconds[i], await time(i));
  return again.length;
}

/**
 * Seconds per run of each candidate, timed by `time`, and the fastest: every
 * candidate once, then the finalists again ({@link retimeFinalists}).
 */
export async function timeCandidates<T>(
  candidates: readonly T[],
  time: (candidate: T) => Promise<number>,
  finalists = 3,
): Promise<{ best: T; seconds: number[] }> {
  const seconds: number[] = [];
  for (const c of candidates) seconds.push(await time(c));
  await retimeFinalists(seconds, (i) => time(candidates[i]), finalists);
  const best = seconds.reduce((b, x, i) => (x < seconds[b] ? i : b), 0);
  return { best: candidates[best], seconds };
}

/**
 * Times one run of a candidate: seconds per call of `run`, which records the
 * candidate's dispatches. The tuners default to {@link secondsPerRun}; tests
 * inject their own to check what the tuner does with the figures.
 */
export type CandidateTimer<T> = (candidate: T, run: () => void) => Promise<number>;

/** `timer`, or by default {@link secondsPerRun} on `gpu`. */
export function timerOn<T>(gpu: Gpu, timer?: CandidateTimer<T>): CandidateTimer<T> {
  return timer ?? ((_, run) => secondsPerRun(gpu, run));
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
