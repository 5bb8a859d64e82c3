/**
 * The adapter's subgroup matrices (tensor cores on NVIDIA): Dawn's
 * `chromium-experimental-subgroup-matrix` feature and the shapes the
 * adapter multiplies (`adapter.info.subgroupMatrixConfigs`). A kernel must
 * use one of these shapes exactly (any other fails pipeline creation) and
 * size its workgroups' x by the adapter's largest subgroup, so every
 * subgroup-matrix kernel takes both from here, never from constants: Mesa
 * 26's lavapipe lists four, all 8×8×8 (f16→f16, f16→f32, u8→u32, i8→i32),
 * with subgroups of 8; NVIDIA 16×16×16 and 16×8×16 with subgroups of 32.
 */

/**
 * The WebGPU feature subgroup-matrix kernels need (Dawn only, behind
 * `allow_unsafe_apis`; Deno's own WebGPU never grants it).
 */
export const SUBGROUP_MATRIX_FEATURE = "chromium-experimental-subgroup-matrix" as GPUFeatureName;

/**
 * One shape the adapter multiplies subgroup matrices in (a Dawn
 * `GPUSubgroupMatrixConfig`, copied field by field: Dawn's own objects are
 * native and `JSON.stringify` prints them as `{}`): an M×K `componentType`
 * left matrix times a K×N right one, summed into an M×N `resultComponentType`
 * result; plus the adapter's subgroup size, which kernels need beside it.
 */
export interface SubgroupMatrixConfig {
  /** The operands' component type: "f16", "f32", "u8" or "i8". */
  componentType: string;
  /** The result's component type: "f16", "f32", "u32" or "i32". */
  resultComponentType: string;
  /** Rows of the left operand and of the result. */
  M: number;
  /** Columns of the right operand and of the result. */
  N: number;
  /** Columns of the left operand, rows of the right one. */
  K: number;
  /**
   * The adapter's largest subgroup (not part of Dawn's config): a workgroup's
   * x size must be a multiple of it, and each of its runs of this many
   * invocations is one subgroup.
   */
  subgroupSize: number;
}

/** What Dawn's adapter info adds (native objects: read the fields, `JSON.stringify` prints `{}`). */
interface DawnAdapterInfo {
  subgroupMaxSize?: number;
  subgroupMatrixConfigs?: Iterable<Omit<SubgroupMatrixConfig, "subgroupSize">>;
}

/**
 * The subgroup-matrix shapes a device may use, as plain objects: the
 * adapter's, where the device was granted {@link SUBGROUP_MATRIX_FEATURE},
 * else none.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../mod.ts";
 * import { subgroupMatrixConfigsOf } from "./subgroup_matrix_configs.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const configs = subgroupMatrixConfigsOf(gpu.adapterInfo, gpu.device.features);
 * // None on Deno's own WebGPU; Dawn lists the adapter's (lavapipe: 8×8×8, subgroups of 8).
 * assert.deepEqual(configs, gpu.adapterProfile.subgroupMatrixConfigs);
 * gpu.destroy();
 * ```
 */
export function subgroupMatrixConfigsOf(
  info: GPUAdapterInfo,
  features: { has(name: string): boolean },
): SubgroupMatrixConfig[] {
  if (!features.has(SUBGROUP_MATRIX_FEATURE)) return [];
  const dawn = info as GPUAdapterInfo & DawnAdapterInfo;
  const subgroupSize = dawn.subgroupMaxSize ?? 32;
  return [...dawn.subgroupMatrixConfigs ?? []].map((c) => ({
    componentType: String(c.componentType),
    resultComponentType: String(c.resultComponentType),
    M: Number(c.M),
    N: Number(c.N),
    K: Number(c.K),
    subgroupSize,
  }));
}

/**
 * The config halfstep's f16 products use: f16 operands into f32 results
 * (AMP's accumulation), the largest such shape (more work per matrix
 * instruction); undefined where the adapter has none.
 */
export function f16MatrixConfig(
  configs: readonly SubgroupMatrixConfig[],
): SubgroupMatrixConfig | undefined {
  const f16 = configs.filter((c) => c.componentType === "f16" && c.resultComponentType === "f32");
  return f16.sort((a, b) => b.M * b.N * b.K - a.M * a.N * a.K)[0];
}
