/**
 * What the per-shape tuners (matmul: gpu/kernels/gemm/shape_picks.ts and
 * gpu/kernels/gemm/shape_tuner.ts; attention: gpu/kernels/attention/settings.ts and
 * gpu/kernels/attention/tuner.ts) share: a device's picks by shape key with the
 * shapes it ran, the per-adapter cache they are read from and written to
 * (versioned key; each entry names its adapter and is checked before it is
 * trusted), and the loop that times the shapes without a pick.
 */
import type { Gpu } from "../device/gpu.ts";
import {
  type CandidateTimer,
  progressReporter,
  tunerCacheKey,
  type TuningProgress,
  winnerCache,
} from "./timing.ts";

/** A measured pick: at least its shape and its time (seconds per run). */
export interface TimedPick<S> {
  /** The shape it was measured at. */
  shape: S;
  /** Seconds per run of the pick when it was measured (kept in the cache). */
  seconds: number;
}

/** One device's picks and the shapes it ran (a per-shape tuner's settings). */
export interface ShapePicks<S, R extends TimedPick<S>, P> {
  /** Picks by shape key. */
  readonly picks: Map<string, R>;
  /** Every shape run, with a problem of theirs, for the tuner's default list. */
  readonly seen: Map<string, { shape: S; problem: P }>;
  /** Keys whose pick came from the cache. */
  readonly fromCache: Set<string>;
}

/** How a per-shape tuner names and checks its picks. */
export interface PickStore<S, R extends TimedPick<S>> {
  /** The tuner's name in its cache key (`"matmulShapes"`). */
  tuner: string;
  /** Bump when kernels or the pick's meaning change: older cached picks are ignored. */
  version: number;
  /** A shape's key. */
  keyOf(shape: S): string;
  /** A stored entry as a current record (its fields only), or undefined when it is not one. */
  check(gpu: Gpu, entry: R): R | undefined;
}

/** The `localStorage` key of a tuner's picks on `gpu` (per adapter, profile and version). */
export function pickCacheKey<S, R extends TimedPick<S>>(gpu: Gpu, store: PickStore<S, R>): string {
  return tunerCacheKey(gpu, store.tuner, store.version);
}

/** Who measured a pick: the adapter and the profile it ran as. */
function adapterLabel(gpu: Gpu): string {
  return `${gpu.adapterName} [${gpu.adapterProfile.name}]`;
}

function cacheOf<S, R extends TimedPick<S>>(gpu: Gpu, store: PickStore<S, R>) {
  const adapter = adapterLabel(gpu);
  return winnerCache(pickCacheKey(gpu, store), (stored) => {
    try {
      const entry = stored as R & { adapter: string };
      if (entry.adapter !== adapter || !(entry.seconds > 0)) return undefined;
      return store.check(gpu, entry);
    } catch {
      return undefined;
    }
  });
}

/** `gpu`'s picks as the cache has them (none noted yet): a device's state when it starts. */
export function cachedPicks<S, R extends TimedPick<S>, P>(
  gpu: Gpu,
  store: PickStore<S, R>,
): ShapePicks<S, R, P> {
  const picks = new Map<string, R>();
  // An entry stored under another shape's key is not trusted either.
  for (const [key, record] of Object.entries(cacheOf(gpu, store).read())) {
    if (store.keyOf(record.shape) === key) picks.set(key, record);
  }
  return { picks, seen: new Map(), fromCache: new Set(picks.keys()) };
}

/** Adds `records` to `gpu`'s cache of the tuner's picks. */
export function cachePicks<S, R extends TimedPick<S>>(
  gpu: Gpu,
  store: PickStore<S, R>,
  records: ReadonlyMap<string, R>,
): void {
  const adapter = adapterLabel(gpu);
  const entries = new Map([...records].map(([k, r]) => [k, { ...r, adapter }]));
  cacheOf(gpu, store).write(entries as unknown as Map<string, R>);
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

/** What {@link tunePicks} does: which shapes, and how one is measured. */
export interface PickTuning<S, R extends TimedPick<S>, P> {
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
 * Times each asked shape without a pick (with `force`, also those the cache
 * gave, and every listed one), records the picks in `state`, caches them
 * when asked, and returns every asked shape's pick.
 */
export async function tunePicks<S, R extends TimedPick<S>, P>(
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
  if (tuning.cache) cachePicks(gpu, store, fresh);
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
