/**
 * Lazy tuning: a kernel is tuned the first time its shape runs, at the next
 * point where the caller waits for the GPU anyway, within a budget, so a
 * tiny model starts at once and a big one pays only for the shapes it runs.
 *
 * Why at waits. A training step records its dispatches synchronously and
 * never reads back, and timing a candidate needs many GPU waits, so tuning
 * can only run where the caller already waits. A dispatch whose key has no
 * pick (a matmul class, an attention dtype; on GPUs also an exact product or
 * attention shape) runs the default and notes the key here
 * ({@link noteUntuned}: a map lookup). At the end of each wait —
 * `gpu.sync()`, `read()`, `item()` — once the caller's work has finished,
 * the device runs {@link tuneAtWait} (`Gpu.setWaitWork`), which measures
 * the noted keys with their family's tuner; `await tunePending(gpu)` runs
 * them all at once. The picks go to the per-user cache (store.ts), which
 * the next run reads at start-up, from any folder.
 *
 * What it never does. It never changes work already recorded: a product's
 * tiling is chosen when the product is recorded, and tuning runs only after
 * the wait submitted that work (work recorded meanwhile is submitted by the
 * tuner's first timing, as recorded). It never tunes inside `gpu.profile()`
 * (the figures are the caller's), nor a product under {@link LAZY_MIN_WORK}
 * multiply-adds (its time is the launch: any tiling will do), and a tuning
 * failure never stops the run (said once; the key keeps the default).
 *
 * Budget ({@link LAZY_TUNING_BUDGET}). A wait starts no job (one key: a
 * class's candidates, or a shape's, each about 13 timings) once 2 s have
 * gone on tuning at that wait, and none once 60 s have gone in all on the
 * device: a wait grows by 2 s and one job at most (a class takes 2–4 s on
 * lavapipe, a shape milliseconds on a GPU). Coarse keys (classes, dtypes)
 * go before shapes, each in the order it first ran. What a wait's budget
 * leaves goes to the next wait; what the total leaves keeps its default
 * until `tunePending(gpu)`. With 0 s a wait, keys are noted and never tuned
 * at a wait: `tunePending` says when (the benchmark does, before it times).
 *
 * Determinism. Different tilings may round differently (their sums run in
 * another order), so: a run whose picks all come from the cache repeats
 * bit for bit, and two runs with the same complete cache give the same
 * bits — as a resumed run does, which reads the picks its first part
 * measured (when that part had tuned every key it ran before it saved, as
 * its saves' reads are waits: unless the budget stopped it). A key the
 * cache lacks runs the default until the wait after it
 * first ran, then its pick: the first steps of a cold run may differ from a
 * warm one's. To compare bits within one process, or between cold runs,
 * use `initGpu({ tuning: "eager" })` (everything tuned at start-up) or
 * `"off"`.
 */
import type { Gpu } from "../device/gpu.ts";
import { warnOnce } from "../base/warn_once.ts";
import type { CandidateTimer, TuningProgress } from "./timing.ts";
import { defineTunerSettings, settingsChanged, type TunerSettings } from "./settings.ts";

/** When kernels are tuned: as they first run, all at start-up, or never. */
export type TuningMode = "lazy" | "eager" | "off";

/** How long lazy tuning may take, in wall seconds. */
export interface TuningBudget {
  /** A wait starts no job once this long has gone on tuning at it. */
  perWaitSeconds: number;
  /** No job starts once this long has gone on lazy tuning on the device. */
  totalSeconds: number;
}

/** The budget of lazy tuning (see the module comment). */
export const LAZY_TUNING_BUDGET: Readonly<TuningBudget> = { perWaitSeconds: 2, totalSeconds: 60 };

/** Multiply-adds under which a product (or attention) is never a reason to tune. */
export const LAZY_MIN_WORK = 2 ** 18;

/** Tunes one noted key (its family's tuner; `timer` from tests). */
export type LazyRunner = (
  gpu: Gpu,
  shape: unknown,
  timer?: CandidateTimer<unknown>,
) => Promise<unknown>;

/** A key noted untuned: its tuner's task, its key and what the tuner is given. */
export interface PendingTuning {
  /** The tuner's task (`"matmul tilings"`). */
  task: string;
  /** The key (`"f32/nt/medium"`). */
  key: string;
  /** The class or shape, as the tuner takes it. */
  shape: unknown;
}

/** A device's lazy tuning: its mode, budget, runners and the keys noted. */
export interface LazyTuning {
  /** Only `"lazy"` notes keys and tunes them at waits. */
  mode: TuningMode;
  /** The budget (tests shrink it). */
  budget: TuningBudget;
  /** Wall seconds, for the budget (tests inject one). */
  clock: () => number;
  /** Times candidates instead of the GPU (tests; the cache is then left alone). */
  timer?: CandidateTimer<unknown>;
  /** Told before each wait's first job and after each. */
  onProgress?: (progress: TuningProgress) => void;
  /** The tuner of each task, in the order tasks go (coarse keys first). */
  readonly runners: Map<string, LazyRunner>;
  /** Keys noted and not yet tuned, by `task key`, in the order they first ran. */
  readonly pending: Map<string, PendingTuning>;
  /** Keys tuned (or given up) on this device: never noted again. */
  readonly finished: Set<string>;
  /** Wall seconds lazy tuning has taken on this device. */
  spentSeconds: number;
  /** True once the total budget stopped it (said once). */
  overBudget: boolean;
}

/**
 * A device's lazy tuning (`lazyTuning.of(gpu)`), off until `initGpu` (or a
 * test) turns it on; a profile switch (`withAdapterProfile`) starts with
 * it off.
 */
export const lazyTuning: TunerSettings<LazyTuning> = defineTunerSettings("lazy tuning", () => ({
  mode: "off",
  budget: { ...LAZY_TUNING_BUDGET },
  clock: () => performance.now() / 1000,
  runners: new Map(),
  pending: new Map(),
  finished: new Set(),
  spentSeconds: 0,
  overBudget: false,
}));

/**
 * Notes that a dispatch ran `key` of `task` without a pick, doing `work`
 * multiply-adds: tuned at the next wait when the device tunes lazily, the
 * work is large enough, and the key was not noted before. Called by
 * dispatch; costs a map lookup.
 */
export function noteUntuned(
  gpu: Gpu,
  task: string,
  key: string,
  shape: unknown,
  work: number,
): void {
  const lazy = lazyTuning.of(gpu);
  if (lazy.mode !== "lazy" || work < LAZY_MIN_WORK || !lazy.runners.has(task)) return;
  const id = `${task} ${key}`;
  if (lazy.pending.has(id) || lazy.finished.has(id)) return;
  lazy.pending.set(id, { task, key, shape });
}

/** The keys noted and not yet tuned on `gpu`, in the order they will be. */
export function pendingTuning(gpu: Gpu): PendingTuning[] {
  const lazy = lazyTuning.of(gpu);
  const tasks = [...lazy.runners.keys()];
  return [...lazy.pending.values()].sort((a, b) => tasks.indexOf(a.task) - tasks.indexOf(b.task));
}

/**
 * Tunes the keys noted on `gpu` within the budget (see the module
 * comment); `unbounded` ignores it. Returns how many keys it tuned. Runs at
 * the end of each wait, where nothing is pending costs a map's size.
 */
export async function tuneAtWait(gpu: Gpu, unbounded = false): Promise<number> {
  const lazy = lazyTuning.of(gpu);
  if (lazy.pending.size === 0) return 0;
  const { budget, clock } = lazy;
  const started = clock();
  const spent = () => clock() - started;
  const peak = gpu.memoryStats().peakBytes;
  const total = lazy.pending.size;
  let done = 0;
  try {
    for (const job of pendingTuning(gpu)) {
      if (!unbounded && spent() >= budget.perWaitSeconds) break;
      if (!unbounded && lazy.spentSeconds + spent() >= budget.totalSeconds) {
        if (!lazy.overBudget) {
          // Information, on stderr as the tuning line: stdout stays the script's.
          const left = lazy.pending.size;
          console.error(
            `halfstep: lazy tuning stopped at its budget of ${budget.totalSeconds} s; ${left} ` +
              `more ${left === 1 ? "kernel keeps its" : "kernels keep their"} default ` +
              "(await tunePending(gpu) tunes what is left)",
          );
        }
        lazy.overBudget = true;
        break;
      }
      if (done === 0) lazy.onProgress?.({ task: job.task, done, total });
      const id = `${job.task} ${job.key}`;
      lazy.pending.delete(id);
      lazy.finished.add(id);
      try {
        await lazy.runners.get(job.task)!(gpu, job.shape, lazy.timer);
      } catch (e) {
        const why = (e instanceof Error ? e.message : String(e)).split("\n")[0].slice(0, 160);
        warnOnce(`tuning ${job.task} ${job.key} failed (${why}); it keeps the default`);
      }
      done++; // counted here: an optional call skips its arguments when there is no callback
      lazy.onProgress?.({ task: job.task, done, total });
    }
  } finally {
    lazy.spentSeconds += spent();
    if (done > 0) {
      settingsChanged(gpu); // new picks: captured steps record again
      // The tuners' scratch buffers leave the pool and the caller's figures.
      gpu.flush();
      gpu.pool.releaseCached();
      gpu.pool.restorePeak(peak);
    }
  }
  return done;
}

/**
 * Tunes now, without the budget, every kernel shape that ran untuned on
 * `gpu` (see the module comment); returns how many. For a benchmark before
 * it times, or a script that would rather pay once up front. Waits for the
 * GPU many times: call it between steps.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, matmul, Tensor, tunePending } from "../mod.ts";
 * const gpu = await initGpu({ tuning: "off" });
 * matmul(Tensor.full([64, 64], 1), Tensor.full([64, 64], 1)).dispose();
 * assert.equal(await tunePending(gpu), 0, "nothing is noted when tuning is off");
 * gpu.destroy();
 * ```
 */
export function tunePending(gpu: Gpu): Promise<number> {
  return tuneAtWait(gpu, true);
}
