/**
 * What every tuner shares beyond timing: a device's table of picks by key
 * (a matmul class or attention dtype is a coarse key, an exact product or
 * attention shape a fine one), the shapes it ran, and the driver that times
 * the keys without a pick, records the picks and caches them (cache.ts). The
 * class tuners (gpu/kernels/gemm/class_tuner.ts, attention/tuner.ts) and the
 * per-shape ones (gemm/shape_tuner.ts, attention/tuner.ts) are this driver
 * with their own problems and candidates.
 */
import type { Gpu } from "../device/gpu.ts";
import { type PickStore, readPicks, type TimedPick, writePicks } from "./cache.ts";
import { type CandidateTimer, progressReporter, timerOn, type TuningProgress } from "./timing.ts";

/** One device's picks by key and the shapes it ran (a per-shape tuner's settings). */
export interface ShapePicks<S, R extends TimedPick<S>, P> {
  /** Picks by shape key. */
  readonly picks: Map<string, R>;
  /** Every shape run, with a problem of theirs, for the tuner's default list. */
  readonly seen: Map<string, { shape: S; problem: P }>;
  /** Keys whose pick came from the cache. */
  readonly fromCache: Set<string>;
}

/** A table with no picks. */
export function emptyPicks<S, R extends TimedPick<S>, P>(): ShapePicks<S, R, P> {
  return { picks: new Map(), seen: new Map(), fromCache: new Set() };
}

/** `gpu`'s picks as the cache has them (none noted yet): a device's state when it starts. */
export function cachedPicks<S, R extends TimedPick<S>, P>(
  gpu: Gpu,
  store: PickStore<S, R>,
): ShapePicks<S, R, P> {
  const picks = readPicks(gpu, store);
  return { picks, seen: new Map(), fromCache: new Set(picks.keys()) };
}

/** Options of a class tuner (`tuneMatmul`, `tuneAttention`). */
export interface ClassTuningOptions<C> {
  /** Measure again even when the cache has a winner (default false). */
  force?: boolean;
  /**
   * Times a candidate's run (default: GPU timestamps, else wall time; see
   * `secondsPerRun`). Given one, the cache is neither read nor written unless
   * `cache` says so: its figures need not be this adapter's (tests inject one
   * to check the pick).
   */
  timer?: CandidateTimer<C>;
  /** Read the per-adapter cache and write what is measured (default: only when `timer` is not given). */
  cache?: boolean;
  /** Told before the first class the cache lacks is measured and after each. */
  onProgress?: (progress: TuningProgress) => void;
}

/** Options of a per-shape tuner (`tuneMatmulShapes`, `tuneAttentionShapes`). */
export interface ShapeTuningOptions<S, C> {
  /** Shapes to tune (default: every shape run on this device since it started). */
  shapes?: readonly S[];
  /**
   * Measure again what the cache gave (and every listed shape), not only
   * shapes without a pick (default false).
   */
  force?: boolean;
  /** Times one candidate's run (default: GPU timestamps, else wall time; see `secondsPerRun`). */
  timer?: CandidateTimer<C>;
  /** Write picks to the per-adapter cache (default: only when `timer` is not given). */
  cache?: boolean;
  /** Told before the first shape is measured and after each. */
  onProgress?: (progress: TuningProgress) => void;
}

/** Measures one key's candidates with `timer`: its record and the timings it took. */
export type MeasurePick<S, R, P, C> = (
  shape: S,
  problem: P,
  timer: CandidateTimer<C>,
) => Promise<{ record: R; trials: number }>;

/**
 * A class tuner's run over `listed` (each with the problem it is timed on):
 * the cache is read when it runs and what it measured is written back
 * (with a test timer only when `cache` is set); with `force`, or without
 * the cache, every class is measured.
 */
export function tuneClasses<S, R extends TimedPick<S>, P, C>(
  gpu: Gpu,
  store: PickStore<S, R>,
  task: string,
  listed: { shape: S; problem: P }[],
  options: ClassTuningOptions<C>,
  measure: MeasurePick<S, R, P, C>,
): Promise<PickOutcome<R>[]> {
  const timer = timerOn(gpu, options.timer);
  const cache = options.cache ?? !options.timer;
  const afresh = !!options.force || !cache;
  const table = afresh ? emptyPicks<S, R, P>() : cachedPicks<S, R, P>(gpu, store);
  return tunePicks(gpu, table, {
    store,
    listed,
    force: afresh,
    cache,
    task,
    onProgress: options.onProgress,
    measure: (shape, problem) => measure(shape, problem, timer),
  });
}

/**
 * A per-shape tuner's run on the device's `table`: the shapes `options`
 * lists (timed on `problemOf(shape)`), else every shape seen.
 */
export function tuneShapes<S, R extends TimedPick<S>, P, C>(
  gpu: Gpu,
  table: ShapePicks<S, R, P>,
  store: PickStore<S, R>,
  task: string,
  options: ShapeTuningOptions<S, C>,
  problemOf: (shape: S) => P,
  measure: MeasurePick<S, R, P, C>,
): Promise<PickOutcome<R>[]> {
  const timer = timerOn(gpu, options.timer);
  return tunePicks(gpu, table, {
    store,
    listed: options.shapes?.map((shape) => ({ shape, problem: problemOf(shape) })),
    force: options.force,
    cache: options.cache ?? !options.timer,
    task,
    onProgress: options.onProgress,
    measure: (shape, problem) => measure(shape, problem, timer),
  });
}

/** What {@link tunePicks} does: which shapes, and how one is measured. */
interface PickTuning<S, R extends TimedPick<S>, P> {
  /** The store the picks belong to. */
  store: PickStore<S, R>;
  /** The shapes the caller listed (with a problem each), or undefined: every shape seen. */
  listed?: { shape: S; problem: P }[];
  /** Measure again what the cache gave (and every listed shape). */
  force?: boolean;
  /** Write fresh picks to the cache. */
  cache: boolean;
  /** The progress task (`"matmul shapes"`) and its listener. */
  task: string;
  /** Told before the first shape is measured and after each. */
  onProgress?: (progress: TuningProgress) => void;
  /** Times one shape's candidates: its record and the timings it took. */
  measure(shape: S, problem: P): Promise<{ record: R; trials: number }>;
}

/** One shape's outcome of {@link tunePicks}. */
export interface PickOutcome<R> {
  /** The shape's key. */
  key: string;
  /** Its pick (measured now, earlier, or cached). */
  record: R;
  /** Timings this run made for it (0 when it had a pick). */
  trials: number;
  /** True when the pick came from the per-adapter cache. */
  cached: boolean;
}

/**
 * The driver every tuner runs: times each asked key without a pick (with `force`, also those the cache
 * gave, and every listed one), records the picks in `state`, caches them
 * when asked, and returns every asked shape's pick.
 */
async function tunePicks<S, R extends TimedPick<S>, P>(
  gpu: Gpu,
  state: ShapePicks<S, R, P>,
  tuning: PickTuning<S, R, P>,
): Promise<PickOutcome<R>[]> {
  const { store } = tuning;
  const asked = tuning.listed ?? [...state.seen.values()];
  const wanted = (shape: S) => {
    const key = store.keyOf(shape);
    if (!state.picks.has(key)) return true;
    return !!tuning.force && (!!tuning.listed || state.fromCache.has(key));
  };
  const todo = new Set(asked.filter(({ shape }) => wanted(shape)));
  const measured = progressReporter(tuning.task, todo.size, tuning.onProgress);
  const fresh = new Map<string, R>();
  const results: PickOutcome<R>[] = [];
  for (const item of asked) {
    const key = store.keyOf(item.shape);
    let trials = 0;
    if (todo.has(item)) {
      const timed = await tuning.measure(item.shape, item.problem);
      trials = timed.trials;
      fresh.set(key, timed.record);
      state.picks.set(key, timed.record);
      state.fromCache.delete(key);
      measured();
    }
    const cached = trials === 0 && state.fromCache.has(key);
    results.push({ key, record: state.picks.get(key)!, trials, cached });
  }
  if (tuning.cache) writePicks(gpu, store, fresh);
  return results;
}

/** Every pick in `state` as an outcome of no timings (a report). */
export function pickReport<S, R extends TimedPick<S>, P>(
  state: ShapePicks<S, R, P>,
): PickOutcome<R>[] {
  return [...state.picks].map(([key, record]) => ({
    key,
    record,
    trials: 0,
    cached: state.fromCache.has(key),
  }));
}
