/**
 * The device every test shares. A test that cannot get an adapter fails
 * loudly: CI installs lavapipe so that no GPU test is ever skipped.
 */
import {
  initGpu,
  MATMUL_CANDIDATES,
  type MatmulTiling,
  type ProfileLimits,
} from "../../gpu/mod.ts";
import { gpuLikeProfile, withAdapterProfile } from "../../gpu/tuning/profile_switch.ts";
import { tilingFits, tilingKind } from "../../gpu/kernels/gemm/tilings.ts";
import { matmulSettings } from "../../gpu/kernels/gemm/settings.ts";
import { rowSettings } from "../../gpu/kernels/rows/row_layout.ts";
import { elementwiseSettings } from "../../gpu/kernels/elementwise.ts";

/** The shared device (f16 on when the adapter has it). */
export const gpu = await initGpu({ f16: "auto", matmulTiling: "default" });

/** Options for Deno.test: device state outlives single tests, by design. */
export const GPU_TEST = { sanitizeResources: false, sanitizeOps: false } as const;

/**
 * Runs `fn` with the shared device as a GPU (`gpuLikeProfile`, with `limits`
 * on top): every adapter-derived choice takes its GPU branch while lavapipe
 * runs the kernels; then restores the device's own profile.
 */
export function asGpu<T>(fn: () => Promise<T>, limits: Partial<ProfileLimits> = {}): Promise<T> {
  return withAdapterProfile(gpu, gpuLikeProfile(gpu, limits), fn);
}

/**
 * Runs `fn` with the fields `values` gives set on a kernel family's tuning
 * `settings` (e.g. `matmulSettings.of(gpu)`), then restores the earlier values.
 */
export async function withSettings<S extends object, T>(
  settings: S,
  values: Partial<S>,
  fn: () => Promise<T>,
): Promise<T> {
  const earlier = Object.fromEntries(Object.keys(values).map((k) => [k, settings[k as keyof S]]));
  Object.assign(settings, values);
  try {
    return await fn();
  } finally {
    Object.assign(settings, earlier);
  }
}

/**
 * Runs `fn` with `tiling` as the shared device's matmul tiling for every
 * class (no class winners), then restores the tiling and the winners.
 */
export async function withTiling<T>(tiling: MatmulTiling, fn: () => Promise<T>): Promise<T> {
  const settings = matmulSettings.of(gpu);
  const winners = [...settings.classTilings];
  settings.classTilings.clear();
  try {
    return await withSettings(settings, { tiling }, fn);
  } finally {
    for (const [key, t] of winners) settings.classTilings.set(key, t);
  }
}

/**
 * Runs `fn` once with each CPU matmul tiling candidate and the last (the
 * smallest) GPU candidate of each kind that fits the device as the device's
 * tiling, then restores it (every GPU candidate: tests/gpu/kernels/matmul_tilings_test.ts).
 */
export async function withEachTiling(fn: (tiling: MatmulTiling) => Promise<void>): Promise<void> {
  const limits = gpu.device.limits;
  const cpu = MATMUL_CANDIDATES.filter((t) => !tilingKind(t).forGpus);
  const gpuKinds = new Map<string, MatmulTiling>();
  for (const t of MATMUL_CANDIDATES) {
    if (tilingKind(t).forGpus && tilingFits(t, "f32", limits)) gpuKinds.set(t.variant, t);
  }
  for (const tiling of [...cpu, ...gpuKinds.values()]) await withTiling(tiling, () => fn(tiling));
}

/**
 * Runs `fn` with every row kernel in each layout (a workgroup per row, then a
 * thread per row up to 16384 entries), then restores. NOTE: not every row:
 * lavapipe stops a shader invocation after 65535 loop iterations, so longer
 * rows cannot run one per thread there.
 */
export async function withEachRowLayout(fn: (layout: string) => Promise<void>): Promise<void> {
  for (const [layout, threadRowMax] of [["workgroup", 0], ["thread", 16384]] as const) {
    await withSettings(rowSettings.of(gpu), { threadRowMax }, () => fn(layout));
  }
}

/**
 * Runs `fn` with the scalar elementwise kernels, then the vec4 ones (see
 * `elementwiseSettings`; they run where operands are one-to-one and the
 * count is a multiple of 4), then restores.
 */
export async function withEachElementwiseWidth(
  fn: (vec4: boolean) => Promise<void>,
): Promise<void> {
  for (const vec4 of [false, true]) {
    await withSettings(elementwiseSettings.of(gpu), { vec4 }, () => fn(vec4));
  }
}

/** The kernel key of each dispatch `fn` records on the shared device, in order. */
export function dispatchedKernels(fn: () => void): string[] {
  const { keys, stop } = recordDispatches();
  try {
    fn();
  } finally {
    stop();
  }
  return keys;
}

/** {@link dispatchedKernels} for an async `fn` (one that awaits reads between dispatches). */
export async function dispatchedKernelsAsync(fn: () => Promise<void>): Promise<string[]> {
  const { keys, stop } = recordDispatches();
  try {
    await fn();
  } finally {
    stop();
  }
  return keys;
}

/** Appends each dispatch's kernel key to `keys` until `stop` puts the device's dispatch back. */
function recordDispatches(): { keys: string[]; stop: () => void } {
  const keys: string[] = [];
  const dispatch = gpu.batch.dispatch.bind(gpu.batch);
  gpu.batch.dispatch = (kernel, ...rest) => {
    keys.push(kernel.key);
    dispatch(kernel, ...rest);
  };
  return { keys, stop: () => void (gpu.batch.dispatch = dispatch) };
}
