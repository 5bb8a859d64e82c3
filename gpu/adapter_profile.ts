/**
 * The adapter profile: the one description of the adapter that every
 * adapter-derived choice reads — whether it is a CPU adapter, its subgroup
 * size, and the limits that filter kernel candidates — instead of
 * `adapterInfo.isFallbackAdapter` and `device.limits` read here and there.
 *
 * Why it exists: halfstep is mostly developed and always tested on lavapipe,
 * a CPU (fallback) adapter, so every branch written for GPUs — the blocked
 * matmul tilings and their workgroup-memory filter, the small and large size
 * classes, split-K at a GPU's target, 16 tensors per multi-tensor dispatch,
 * staged attention plans, row kernels switching to a workgroup per row at 64
 * entries — would otherwise never run before a user's GPU runs it. A test
 * swaps in {@link gpuLikeProfile} with {@link withAdapterProfile}: the same
 * code then takes its GPU branches, and lavapipe executes the kernels. The
 * GPU-like limits are capped at the device's real ones, so everything chosen
 * can still run there.
 */
import type { Gpu } from "./device.ts";
import { withFreshTunerSettings } from "./tuners.ts";
import { type SubgroupMatrixConfig, subgroupMatrixConfigsOf } from "./subgroup_matrix_configs.ts";

/** The device limits that choose or filter kernels (the rest are checked by WebGPU itself). */
export interface ProfileLimits {
  /** Bytes of workgroup memory a kernel may declare (blocked tilings, staged attention). */
  maxComputeWorkgroupStorageSize: number;
  /** Threads a workgroup may have (matmul candidates). */
  maxComputeInvocationsPerWorkgroup: number;
  /** Storage bindings a kernel may have (tensors per multi-tensor dispatch). */
  maxStorageBuffersPerShaderStage: number;
}

/** What halfstep knows of an adapter when it picks kernels (see the module comment). */
export interface AdapterProfile {
  /** `"adapter"` for the real adapter's profile, else a test profile's name (kept apart in the tuners' caches). */
  name: string;
  /** True on CPU (fallback) adapters such as lavapipe: CPU tilings and plans, one tensor per dispatch. */
  cpu: boolean;
  /** Threads per subgroup (the adapter's largest; 32 on NVIDIA GPUs). */
  subgroupSize: number;
  /**
   * Whether kernels may use subgroup operations (the device has the
   * `subgroups` feature); false picks the workgroup-memory kernels.
   */
  subgroups: boolean;
  /**
   * Multiprocessors (NVIDIA SMs, AMD CUs) that run workgroups side by side:
   * per-shape matmul tuning tries split-K slice counts that fill whole waves
   * of them. WebGPU does not report it, so it is {@link DEFAULT_MULTIPROCESSORS}
   * (an H100 SXM's 132) unless a profile says otherwise.
   */
  multiprocessors: number;
  /** The limits kernel choices are filtered by. */
  limits: ProfileLimits;
  /**
   * The subgroup-matrix shapes the device may use (Dawn, where the adapter
   * has them; see gpu/subgroup_matrix_configs.ts), else none: the
   * subgroup-matrix matmul tilings are offered only with an f16→f32 one.
   */
  subgroupMatrixConfigs: readonly SubgroupMatrixConfig[];
}

/**
 * The multiprocessor count assumed where WebGPU gives none (always): an H100
 * SXM's 132 SMs. On other GPUs a wave of slices is then mis-sized, which
 * costs tuning time only: the candidates are still timed.
 */
export const DEFAULT_MULTIPROCESSORS = 132;

/**
 * The profile of a real adapter, from its info and the device's limits.
 *
 * @example
 * ```ts
 * import { initGpu } from "./mod.ts";
 * import { adapterProfileOf } from "./adapter_profile.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const profile = adapterProfileOf(gpu.adapterInfo, gpu.device.limits);
 * console.assert(profile.cpu === gpu.adapterInfo.isFallbackAdapter);
 * gpu.destroy();
 * ```
 */
export function adapterProfileOf(
  info: GPUAdapterInfo,
  limits: GPUSupportedLimits,
  subgroups = false,
  subgroupMatrixConfigs: readonly SubgroupMatrixConfig[] = [],
): AdapterProfile {
  // subgroupMaxSize is newer than the rest of GPUAdapterInfo: absent, assume a GPU's 32.
  const maxSize = (info as GPUAdapterInfo & { subgroupMaxSize?: number }).subgroupMaxSize;
  return {
    name: "adapter",
    cpu: info.isFallbackAdapter,
    subgroupSize: maxSize ?? 32,
    subgroups,
    multiprocessors: DEFAULT_MULTIPROCESSORS,
    limits: {
      maxComputeWorkgroupStorageSize: limits.maxComputeWorkgroupStorageSize,
      maxComputeInvocationsPerWorkgroup: limits.maxComputeInvocationsPerWorkgroup,
      maxStorageBuffersPerShaderStage: limits.maxStorageBuffersPerShaderStage,
    },
    subgroupMatrixConfigs,
  };
}

/** An H100's limits through Deno's WebGPU (Vulkan), which {@link gpuLikeProfile} starts from. */
const GPU_LIMITS: ProfileLimits = {
  maxComputeWorkgroupStorageSize: 49152,
  maxComputeInvocationsPerWorkgroup: 1024,
  maxStorageBuffersPerShaderStage: 1048576,
};

/**
 * A profile for tests: a GPU (not a fallback adapter, subgroups of 32, used
 * when `gpu` has the feature, and `gpu`'s own subgroup-matrix shapes) with an H100's limits — each capped at `gpu`'s real limit, so every kernel it
 * chooses still runs there — and `limits` on top (such as WebGPU's default
 * 16 KiB of workgroup memory, to test a candidate filter).
 *
 * @example
 * ```ts
 * import { initGpu } from "./mod.ts";
 * import { gpuLikeProfile, withAdapterProfile } from "./adapter_profile.ts";
 * import { matmulSettings } from "./matmul_settings.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * await withAdapterProfile(gpu, gpuLikeProfile(gpu), () => {
 *   const { splitKWorkgroups } = matmulSettings.of(gpu);
 *   console.assert(splitKWorkgroups === 256 && !gpu.adapterProfile.cpu);
 *   return Promise.resolve();
 * });
 * gpu.destroy();
 * ```
 */
export function gpuLikeProfile(gpu: Gpu, limits: Partial<ProfileLimits> = {}): AdapterProfile {
  const real = gpu.device.limits;
  const capped = Object.fromEntries(
    Object.entries(GPU_LIMITS).map(([name, value]) => [
      name,
      Math.min(value, real[name as keyof ProfileLimits]),
    ]),
  ) as unknown as ProfileLimits;
  return {
    name: "gpu-like",
    cpu: false,
    subgroupSize: 32,
    subgroups: gpu.subgroups,
    multiprocessors: DEFAULT_MULTIPROCESSORS,
    limits: { ...capped, ...limits },
    // The device's own: its kernels run on it.
    subgroupMatrixConfigs: subgroupMatrixConfigsOf(gpu.adapterInfo, gpu.device.features),
  };
}

/**
 * Runs `fn` with `gpu` as if on an adapter of `profile`: the profile, and
 * every kernel family's tuning settings made afresh from it (gpu/tuners.ts:
 * the defaults it gives, no tuned tilings or attention plans, as a new
 * device's); then restores everything. For tests of GPU-only paths on a CPU
 * adapter; kernels still run on `gpu`. @internal
 *
 * @example
 * ```ts
 * import { initGpu } from "./mod.ts";
 * import { gpuLikeProfile, withAdapterProfile } from "./adapter_profile.ts";
 * import { multiTensorSettings } from "./kernels/multi_tensor.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const slots = await withAdapterProfile(gpu, gpuLikeProfile(gpu), () =>
 *   Promise.resolve(multiTensorSettings.of(gpu).slots));
 * console.assert(slots === 16);
 * gpu.destroy();
 * ```
 */
export async function withAdapterProfile<T>(
  gpu: Gpu,
  profile: AdapterProfile,
  fn: () => Promise<T>,
): Promise<T> {
  const saved = gpu.adapterProfile;
  gpu.adapterProfile = profile;
  try {
    return await withFreshTunerSettings(gpu, fn);
  } finally {
    gpu.adapterProfile = saved;
  }
}
