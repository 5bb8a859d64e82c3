/**
 * Lazy tuning under test: the shared device with fresh tuner settings and
 * lazy tuning on, as `initGpu()` starts it, timed by a fake timer that
 * counts its calls and moves a fake clock, with a memory store standing in
 * for the per-user cache (read and written by nothing else).
 */
import type { TuningProgress } from "../../gpu/mod.ts";
import { lazyTuning } from "../../gpu/mod.ts";
import { startLazyTuning } from "../../gpu/kernels/tuning_modes.ts";
import { withFreshTunerSettings } from "../../gpu/tuning/settings.ts";
import { setTuningStore, type TuningStore } from "../../gpu/tuning/store.ts";
import { gpu } from "./gpu.ts";

/** A store in memory: the tests neither read nor write the user's cache. */
function memoryStore(): TuningStore {
  const entries = new Map<string, string>();
  return {
    where: "memory",
    getItem: (key) => entries.get(key) ?? null,
    setItem: (key, value) => void entries.set(key, value),
    removeItem: (key) => void entries.delete(key),
    keys: () => [...entries.keys()],
  };
}

/** What a lazy run measured. */
export interface Lazy {
  /** Each timing's candidate, as JSON. */
  timings: string[];
  /** Progress reports as `task done/total`. */
  progress: string[];
}

/**
 * Runs `fn` with fresh tuner settings (no picks) and lazy tuning on, as
 * `initGpu()` starts it, but timed by a fake timer: each timing takes
 * `secondsPerTiming` of a fake clock, and `fastest` (JSON) is the fastest
 * candidate. `budget` replaces fields of the budget. `profile` runs it
 * (default: with the device's own profile; `asGpu` runs it as a GPU).
 * `onTiming` is told of each timing (after it is recorded).
 */
export async function withLazyTuning(
  options: {
    secondsPerTiming?: number;
    fastest?: string;
    onTiming?: () => void;
    budget?: Partial<{ perWaitSeconds: number; totalSeconds: number }>;
  },
  fn: (lazy: Lazy) => Promise<void>,
  profile: (run: () => Promise<void>) => Promise<void> = (run) => withFreshTunerSettings(gpu, run),
): Promise<void> {
  const saved = setTuningStore(memoryStore());
  const record: Lazy = { timings: [], progress: [] };
  let now = 0;
  try {
    await profile(async () => {
      startLazyTuning(gpu, ({ task, done, total }: TuningProgress) => {
        record.progress.push(`${task} ${done}/${total}`);
      });
      const lazy = lazyTuning.of(gpu);
      Object.assign(lazy.budget, options.budget ?? {});
      lazy.clock = () => now;
      lazy.timer = (candidate) => {
        const name = JSON.stringify(candidate);
        record.timings.push(name);
        now += options.secondsPerTiming ?? 0.01;
        options.onTiming?.();
        return Promise.resolve(name === options.fastest ? 1e-4 : 1e-3);
      };
      await fn(record);
    });
  } finally {
    gpu.setWaitWork(null);
    setTuningStore(saved);
  }
}

/**
 * Runs `fn` with fresh tuner settings and lazy tuning on as `initGpu()`
 * starts it but with no progress callback (as `initGpu({ onProgress })`
 * may leave it) and the real tuners timing on the GPU; waits note keys and
 * never tune (a wait budget of 0 s), so `tunePending` does all of it. A
 * memory store stands in for the per-user cache.
 */
export async function withRealLazyTuning(fn: () => Promise<void>): Promise<void> {
  const saved = setTuningStore(memoryStore());
  try {
    await withFreshTunerSettings(gpu, async () => {
      startLazyTuning(gpu);
      lazyTuning.of(gpu).budget.perWaitSeconds = 0;
      await fn();
    });
  } finally {
    gpu.setWaitWork(null);
    setTuningStore(saved);
  }
}
