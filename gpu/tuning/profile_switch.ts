/**
 * Running a device as another adapter, for tests of GPU-only paths on a CPU
 * adapter: a GPU-like profile (an H100's limits, capped at the device's real
 * ones, so everything chosen can still run there), and the switch that runs a
 * function under it with every kernel family's settings made afresh from it.
 */
import {
  type AdapterProfile,
  DEFAULT_MULTIPROCESSORS,
  type ProfileLimits,
} from "../device/adapter_profile.ts";
import type { Gpu } from "../device/gpu.ts";
import { withFreshTunerSettings } from "./settings.ts";

/** An H100's limits through Deno's WebGPU (Vulkan), which {@link gpuLikeProfile} starts from. */
const GPU_LIMITS: ProfileLimits = {
  maxComputeWorkgroupStorageSize: 49152,
  maxComputeInvocationsPerWorkgroup: 1024,
  maxStorageBuffersPerShaderStage: 1048576,
};

/**
 * A profile for tests: a GPU (not a fallback adapter, subgroups of 32, used
 * when `gpu` has the feature, and `gpu`'s subgroup-matrix shapes) with an H100's limits — each capped at `gpu`'s real limit, so every kernel it
 * chooses still runs there — and `limits` on top (such as WebGPU's default
 * 16 KiB of workgroup memory, to test a candidate filter).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../mod.ts";
 * import { gpuLikeProfile, withAdapterProfile } from "./profile_switch.ts";
 * import { matmulSettings } from "../kernels/gemm/settings.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * await withAdapterProfile(gpu, gpuLikeProfile(gpu), () => {
 *   const { splitKWorkgroups } = matmulSettings.of(gpu);
 *   assert.equal(splitKWorkgroups, 256);
 *   assert.ok(!gpu.adapterProfile.cpu);
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
    subgroupMatrixConfigs: gpu.subgroupMatrixConfigs,
  };
}

/**
 * Runs `fn` with `gpu` as if on an adapter of `profile`: the profile, and
 * every kernel family's tuning settings made afresh from it (gpu/tuning/settings.ts:
 * the defaults it gives, no tuned tilings or attention plans, as a new
 * device's); then restores everything. For tests of GPU-only paths on a CPU
 * adapter; kernels still run on `gpu`. @internal
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../mod.ts";
 * import { gpuLikeProfile, withAdapterProfile } from "./profile_switch.ts";
 * import { multiTensorSettings } from "../kernels/multi_tensor.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const slots = await withAdapterProfile(gpu, gpuLikeProfile(gpu), () =>
 *   Promise.resolve(multiTensorSettings.of(gpu).slots));
 * assert.equal(slots, 16);
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
