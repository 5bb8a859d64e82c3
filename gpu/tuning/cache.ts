/**
 * The tuners' one persistent cache. Every tuner — the class tuners (a matmul
 * class, an attention dtype) and the per-shape ones — keeps its picks as
 * timed records under a string key (cubecl's `AutotuneKey`: a class key is a
 * coarse key, a shape key a fine one), in the per-user store (store.ts: a
 * file in Deno, `localStorage` in browsers), one entry per tuner, version and
 * adapter. Each record names the
 * adapter (and profile) that measured it and is checked against the tuner's
 * current candidates before it is trusted; anything else — an older
 * candidate, another adapter's record, a corrupt cache — is measured again.
 */
import type { Gpu } from "../device/gpu.ts";
import { adapterIdentity, type TuningStore, tuningStore } from "./store.ts";
import { f16MatrixConfig } from "../device/subgroup_matrix_configs.ts";

/** A measured pick: at least its key's value and its time (seconds per run). */
export interface TimedPick<S> {
  /** What it was measured for: a class, or an exact shape. */
  shape: S;
  /** Seconds per run of the pick when it was measured (kept in the cache). */
  seconds: number;
}

/** How a tuner names, versions and checks its picks. */
export interface PickStore<S, R extends TimedPick<S>> {
  /** The tuner's name in its cache key (`"matmulShapes"`). */
  tuner: string;
  /** Bump when kernels or the pick's meaning change: older cached picks are ignored. */
  version: number;
  /** The key of what a pick is for. */
  keyOf(shape: S): string;
  /** A stored entry as a current record (its fields only), or undefined when it is not one. */
  check(gpu: Gpu, entry: R): R | undefined;
}

/**
 * The store key of a tuner's picks on `gpu`: by tuner, version and
 * adapter, by profile when a test runs the device as another adapter
 * (`withAdapterProfile`), so its picks never mix with the real ones, and by
 * the subgroup-matrix shape its device may use: one adapter through Dawn has
 * candidates that it lacks through Deno's WebGPU, so picks made without them
 * are not reused where they exist.
 */
export function pickCacheKey<S, R extends TimedPick<S>>(gpu: Gpu, store: PickStore<S, R>): string {
  const profile = gpu.adapterProfile.name === "adapter" ? "" : ` [${gpu.adapterProfile.name}]`;
  const adapter = `${gpu.adapterName}${adapterIdentity(gpu.adapterInfo)}`;
  const c = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);
  const matrices = c ? ` [subgroup-matrix ${c.M}x${c.N}x${c.K}]` : "";
  return `halfstep.${store.tuner}.v${store.version}:${adapter}${profile}${matrices}`;
}

/** The per-user tuning store (a file in Deno, `localStorage` in browsers; see store.ts). */
function tuningStorage(): TuningStore | null {
  return tuningStore();
}

/** Who measured a pick: the adapter and the profile it ran as. */
function adapterLabel(gpu: Gpu): string {
  return `${gpu.adapterName} [${gpu.adapterProfile.name}]`;
}

/** Every entry of `store` cached for `gpu`, checked: by key, those still current. */
export function readPicks<S, R extends TimedPick<S>>(
  gpu: Gpu,
  store: PickStore<S, R>,
): Map<string, R> {
  const adapter = adapterLabel(gpu);
  const picks = new Map<string, R>();
  let stored: Record<string, unknown>;
  try {
    stored = JSON.parse(tuningStorage()?.getItem(pickCacheKey(gpu, store)) ?? "{}");
  } catch {
    return picks; // a corrupt cache: everything is measured again
  }
  for (const [key, value] of Object.entries(stored ?? {})) {
    try {
      const entry = value as R & { adapter: string };
      if (entry.adapter !== adapter || !(entry.seconds > 0)) continue;
      const record = store.check(gpu, entry);
      // An entry stored under another key is not trusted either.
      if (record && store.keyOf(record.shape) === key) picks.set(key, record);
    } catch {
      // not a record: measured again
    }
  }
  return picks;
}

/** Adds `records` (by key) to `gpu`'s cache of the tuner's picks; other keys are kept. */
export function writePicks<S, R extends TimedPick<S>>(
  gpu: Gpu,
  store: PickStore<S, R>,
  records: ReadonlyMap<string, R>,
): void {
  const storage = tuningStorage();
  if (!storage || records.size === 0) return;
  const adapter = adapterLabel(gpu);
  const fresh = Object.fromEntries([...records].map(([k, r]) => [k, { ...r, adapter }]));
  const earlier = Object.fromEntries(
    [...readPicks(gpu, store)].map(([k, r]) => [k, { ...r, adapter }]),
  );
  storage.setItem(pickCacheKey(gpu, store), JSON.stringify({ ...earlier, ...fresh }));
}
