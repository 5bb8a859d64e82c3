/**
 * Adapters halfstep is built for, described as Dawn reports them (see
 * described_adapter.ts): what the compile test on Dawn's null backend
 * (tests/gpu/device/null_backend_compile_test.ts) builds every pipeline for. The
 * lavapipe entry is measured (Mesa 26.1.6 through npm `webgpu` 0.6.2,
 * 2026-12-01); the GPU entries are read from Dawn's source (its Vulkan and
 * Metal backends' subgroup-matrix tables and its limit caps) and the
 * vendors' Vulkan limits, and should be replaced by a measurement whenever
 * one of those GPUs is at hand (`deno task gpu-check` prints them).
 *
 * Common to the Vulkan ones: Dawn caps storage buffers at 16 a stage (as on
 * lavapipe) and drops bf16 configs; `subgroup-size-control` comes with
 * VK_EXT_subgroup_size_control (core in Vulkan 1.3).
 */
import type { AdapterDescription, DescribedMatrixConfig } from "./described_adapter.ts";

/** The features halfstep asks for, all offered by Dawn's Vulkan backend on these GPUs. */
const VULKAN_FEATURES = [
  "shader-f16",
  "subgroups",
  "timestamp-query",
  "chromium-experimental-subgroup-matrix",
  "subgroup-size-control",
] as const;

/** f16 into f16 and into f32 at each of `shapes` ([M, N, K]). */
function f16Configs(shapes: readonly [number, number, number][]): DescribedMatrixConfig[] {
  return shapes.flatMap(([M, N, K]) =>
    (["f16", "f32"] as const).map((resultComponentType) => ({
      componentType: "f16" as const,
      resultComponentType,
      M,
      N,
      K,
    }))
  );
}

/** A GPU's compute limits through Dawn's Vulkan backend. */
function gpuLimits(workgroupStorage: number, sizeZ: number) {
  return {
    maxComputeWorkgroupStorageSize: workgroupStorage,
    maxComputeInvocationsPerWorkgroup: 1024,
    maxComputeWorkgroupSizeX: 1024,
    maxComputeWorkgroupSizeY: 1024,
    maxComputeWorkgroupSizeZ: sizeZ,
    maxStorageBuffersPerShaderStage: 16,
    maxDynamicStorageBuffersPerPipelineLayout: 16,
    maxStorageBufferBindingSize: 2 ** 31 - 4,
    maxBufferSize: 2 ** 32,
  };
}

/** The described adapters by name. */
export const KNOWN_ADAPTERS: Readonly<Record<string, AdapterDescription>> = {
  "nvidia-h100": {
    name: "nvidia-h100",
    source: "Dawn's Vulkan backend (NVIDIA's cooperative-matrix table); H100 Vulkan limits " +
      "(48 KiB shared memory by default), as the 2026-11-22 run through Deno saw them",
    info: {
      vendor: "nvidia",
      architecture: "hopper",
      device: "0x2330",
      description: "NVIDIA H100 80GB HBM3 (described)",
      isFallbackAdapter: false,
      subgroupMinSize: 32,
      subgroupMaxSize: 32,
      subgroupMatrixConfigs: f16Configs([[16, 16, 16], [16, 8, 16], [16, 8, 8]]),
    },
    features: VULKAN_FEATURES,
    limits: gpuLimits(49152, 64),
  },
  "amd-rdna3": {
    name: "amd-rdna3",
    source: "Dawn's Vulkan backend (AMD RDNA3+ WMMA table); RADV's limits",
    info: {
      vendor: "amd",
      architecture: "rdna-3",
      device: "0x744c",
      description: "AMD Radeon RX 7900 XTX (described)",
      isFallbackAdapter: false,
      subgroupMinSize: 32,
      subgroupMaxSize: 64,
      subgroupMatrixConfigs: f16Configs([[16, 16, 16]]),
    },
    features: VULKAN_FEATURES,
    limits: gpuLimits(65536, 1024),
  },
  "intel-xe2": {
    name: "intel-xe2",
    source: "Dawn's Vulkan backend (Intel Xe2/Xe3 table: 8×16×16 f16→f32); Intel's Vulkan limits",
    info: {
      vendor: "intel",
      architecture: "xe-2lpg",
      device: "0x64a0",
      description: "Intel(R) Arc(TM) 140V GPU (described)",
      isFallbackAdapter: false,
      subgroupMinSize: 16,
      subgroupMaxSize: 32,
      subgroupMatrixConfigs: [
        { componentType: "f16", resultComponentType: "f32", M: 8, N: 16, K: 16 },
      ],
    },
    features: VULKAN_FEATURES,
    limits: gpuLimits(65536, 64),
  },
  "apple-m3": {
    name: "apple-m3",
    source: "Dawn's Metal backend (simdgroup matrices: 8×8×8 f16→f16 and f32→f32 only; no " +
      "subgroup-size control); Metal's limits",
    info: {
      vendor: "apple",
      architecture: "metal-3",
      device: "",
      description: "Apple M3 (described)",
      isFallbackAdapter: false,
      subgroupMinSize: 32,
      subgroupMaxSize: 32,
      subgroupMatrixConfigs: [
        { componentType: "f16", resultComponentType: "f16", M: 8, N: 8, K: 8 },
        { componentType: "f32", resultComponentType: "f32", M: 8, N: 8, K: 8 },
      ],
    },
    features: [
      "shader-f16",
      "subgroups",
      "timestamp-query",
      "chromium-experimental-subgroup-matrix",
    ],
    limits: { ...gpuLimits(32768, 1024), maxStorageBufferBindingSize: 2 ** 30 },
  },
  "lavapipe": {
    name: "lavapipe",
    source: "measured: Mesa 26.1.6 lavapipe through npm webgpu 0.6.2 (CI's Dawn pass), 2026-12-01",
    info: {
      vendor: "mesa",
      architecture: "software",
      device: "llvmpipe-llvm-19-1-7-256-bits-",
      description: "llvmpipe: Mesa 26.1.6-1~bpo13+1 (LLVM 19.1.7) (described)",
      isFallbackAdapter: true,
      subgroupMinSize: 8,
      subgroupMaxSize: 8,
      subgroupMatrixConfigs: [
        ...f16Configs([[8, 8, 8]]),
        { componentType: "u8", resultComponentType: "u32", M: 8, N: 8, K: 8 },
        { componentType: "i8", resultComponentType: "i32", M: 8, N: 8, K: 8 },
      ],
    },
    features: VULKAN_FEATURES,
    limits: {
      maxComputeWorkgroupStorageSize: 32768,
      maxComputeInvocationsPerWorkgroup: 1024,
      maxComputeWorkgroupSizeX: 1024,
      maxComputeWorkgroupSizeY: 1024,
      maxComputeWorkgroupSizeZ: 1024,
      maxStorageBuffersPerShaderStage: 16,
      maxDynamicStorageBuffersPerPipelineLayout: 16,
      maxStorageBufferBindingSize: 134217728,
      maxBufferSize: 4294967295,
    },
  },
};
