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
 * swaps in `gpuLikeProfile` with `withAdapterProfile`: the same
 * code then takes its GPU branches, and lavapipe executes the kernels (the
 * switch is in gpu/tuning/profile_switch.ts, since a profile's settings
 * switch with it).
 */
import type { SubgroupMatrixConfig } from "./subgroup_matrix_configs.ts";

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
   * The subgroup-matrix shapes (tensor cores) kernels may use: the adapter's
   * list where the device has the feature (Dawn only; see
   * gpu/device/subgroup_matrix_configs.ts), else none. Kernels take M, N, K
   * from here (a shape the adapter does not list fails to compile); the
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
 * import assert from "node:assert/strict";
 * import { initGpu } from "../mod.ts";
 * import { adapterProfileOf } from "./adapter_profile.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const profile = adapterProfileOf(gpu.adapterInfo, gpu.device.limits);
 * assert.equal(profile.cpu, gpu.adapterInfo.isFallbackAdapter);
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
