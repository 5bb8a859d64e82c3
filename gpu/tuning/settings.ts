/**
 * Tuning settings, one object per kernel family and device. The device
 * (`Gpu`) keeps facts about the adapter (its profile, f16, subgroups, the
 * loop cap); what a family's tuner chooses — matmul tilings and split-K,
 * attention plans, tensors per multi-tensor dispatch, the row layout, vec4
 * elementwise — lives in that family's settings, defined next to the family
 * (as cubecl's tuners are owned by their kernels) and reached per device
 * with `family.of(gpu)`. A device's settings are made from its adapter
 * profile on first use; tests change a field and restore it, or run with
 * another profile (`withAdapterProfile`), which starts fresh settings.
 */
import type { Gpu } from "../device/gpu.ts";

/** A kernel family's tuning settings, one object per device. */
export interface TunerSettings<S extends object> {
  /** The family's name (for messages). */
  readonly family: string;
  /** `gpu`'s settings of this family, made from its adapter profile on first use. */
  of(gpu: Gpu): S;
  /** Drops `gpu`'s settings of this family: the next {@link TunerSettings.of} makes them afresh. */
  reset(gpu: Gpu): void;
}

/** Every device's settings by family, as they are now (a profile switch swaps the inner map). */
const settings = new WeakMap<Gpu, Map<TunerSettings<object>, object>>();

/** Each device's count of changes to its tuning choices (see {@link settingsEpoch}). */
const epochs = new WeakMap<Gpu, number>();

/**
 * How many times `gpu`'s tuning choices may have changed: a tuner picked
 * (lazy tuning at a wait, `tunePending`), settings were reset or swapped
 * (`withAdapterProfile`), or someone said so with {@link settingsChanged}.
 * A captured step recorded under another count is recorded again: its
 * kernels may no longer be the ones an eager step would run.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../mod.ts";
 * import { settingsChanged, settingsEpoch } from "./settings.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const before = settingsEpoch(gpu);
 * settingsChanged(gpu); // after setting a tiling by hand
 * assert.equal(settingsEpoch(gpu), before + 1);
 * gpu.destroy();
 * ```
 */
export function settingsEpoch(gpu: Gpu): number {
  return epochs.get(gpu) ?? 0;
}

/**
 * Says that `gpu`'s tuning choices changed (a field of a family's settings
 * set by hand): captured steps record again before their next replay.
 */
export function settingsChanged(gpu: Gpu): void {
  epochs.set(gpu, settingsEpoch(gpu) + 1);
}

/**
 * Defines a kernel family's settings: `defaults(gpu)` makes a device's
 * object on first use (reading `gpu.adapterProfile`).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../mod.ts";
 * import { defineTunerSettings } from "./settings.ts";
 * const rows = defineTunerSettings("example", (gpu) => ({ wide: !gpu.adapterProfile.cpu }));
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.equal(rows.of(gpu), rows.of(gpu), "one object per device");
 * gpu.destroy();
 * ```
 */
export function defineTunerSettings<S extends object>(
  family: string,
  defaults: (gpu: Gpu) => S,
): TunerSettings<S> {
  const tuner: TunerSettings<S> = {
    family,
    of(gpu: Gpu): S {
      let families = settings.get(gpu);
      if (!families) settings.set(gpu, families = new Map());
      let own = families.get(tuner) as S | undefined;
      if (!own) families.set(tuner, own = defaults(gpu));
      return own;
    },
    reset(gpu: Gpu): void {
      settings.get(gpu)?.delete(tuner);
      settingsChanged(gpu);
    },
  };
  return tuner;
}

/**
 * Runs `fn` with `gpu`'s settings of every family made afresh (from its
 * adapter profile as it is then), and gives the earlier ones back after.
 * For `withAdapterProfile`. @internal
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../mod.ts";
 * import { defineTunerSettings, withFreshTunerSettings } from "./settings.ts";
 * const counter = defineTunerSettings("example", () => ({ n: 0 }));
 * const gpu = await initGpu({ matmulTiling: "default" });
 * counter.of(gpu).n = 5;
 * await withFreshTunerSettings(gpu, () => Promise.resolve(assert.equal(counter.of(gpu).n, 0)));
 * assert.equal(counter.of(gpu).n, 5);
 * gpu.destroy();
 * ```
 */
export async function withFreshTunerSettings<T>(gpu: Gpu, fn: () => Promise<T>): Promise<T> {
  const saved = settings.get(gpu);
  settings.set(gpu, new Map());
  settingsChanged(gpu);
  try {
    return await fn();
  } finally {
    if (saved) settings.set(gpu, saved);
    else settings.delete(gpu);
    settingsChanged(gpu);
  }
}
