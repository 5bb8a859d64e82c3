/**
 * The adapter's subgroup matrices (tensor cores on NVIDIA): Dawn's
 * `chromium-experimental-subgroup-matrix` feature and the shapes the
 * adapter multiplies (`adapter.info.subgroupMatrixConfigs`). A kernel must
 * use one of these shapes exactly (any other fails pipeline creation) and
 * size its workgroups' x by the adapter's largest subgroup, so every
 * subgroup-matrix kernel takes both from here, never from constants: Mesa
 * 26's lavapipe lists four, all 8×8×8 (f16→f16, f16→f32, u8→u32, i8→i32),
 * with subgroups of 8; NVIDIA 16×16×16, 16×8×16 and 16×8×8 with subgroups of
 * 32; AMD RDNA3 16×16×16 with subgroups of 32 to 64 (gpu/device/known_adapters.ts).
 *
 * A kernel that splits its workgroup into subgroups must know the size they
 * run at. Where the adapter runs several sizes (AMD: 32 or 64), the planned
 * size is pinned with `@subgroup_size` (the device feature
 * {@link SUBGROUP_SIZE_CONTROL_FEATURE}); where it cannot be pinned, only an
 * adapter with one size gets subgroup-matrix kernels.
 */

/**
 * The WebGPU feature that lets a kernel pin its subgroup size
 * (`enable subgroup_size_control;` and `@subgroup_size(n)` on the entry
 * point; Dawn only). It also lifts Dawn's rule that a subgroup-matrix
 * kernel's workgroup x be a multiple of the adapter's largest subgroup.
 */
export const SUBGROUP_SIZE_CONTROL_FEATURE = "subgroup-size-control" as GPUFeatureName;

/**
 * How a subgroup-matrix kernel gets the subgroup size it was planned for:
 * `"pinned"`: it says `@subgroup_size` (the device has
 * {@link SUBGROUP_SIZE_CONTROL_FEATURE}); `"fixed"`: the adapter runs one
 * size only; `"varies"`: neither, so no kernel may rely on it and none is
 * built ({@link f16MatrixConfig} skips such configs).
 */
export type SubgroupSizing = "pinned" | "fixed" | "varies";

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
  /**
   * How kernels get {@link SubgroupMatrixConfig.subgroupSize} (default
   * `"fixed"`): see {@link SubgroupSizing}.
   */
  subgroupSizing?: SubgroupSizing;
}

/** What Dawn's adapter info adds (native objects: read the fields, `JSON.stringify` prints `{}`). */
interface DawnAdapterInfo {
  subgroupMinSize?: number;
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
  const subgroupSizing: SubgroupSizing = features.has(SUBGROUP_SIZE_CONTROL_FEATURE)
    ? "pinned"
    : (dawn.subgroupMinSize ?? subgroupSize) === subgroupSize
    ? "fixed"
    : "varies";
  return [...dawn.subgroupMatrixConfigs ?? []].map((c) => ({
    componentType: String(c.componentType),
    resultComponentType: String(c.resultComponentType),
    M: Number(c.M),
    N: Number(c.N),
    K: Number(c.K),
    subgroupSize,
    subgroupSizing,
  }));
}

/**
 * The config halfstep's f16 products use: f16 operands into f32 results
 * (AMP's accumulation), the largest such shape (more work per matrix
 * instruction); undefined where the adapter has none, or where its subgroup
 * size can neither be pinned nor relied on (`subgroupSizing: "varies"`).
 */
export function f16MatrixConfig(
  configs: readonly SubgroupMatrixConfig[],
): SubgroupMatrixConfig | undefined {
  const f16 = configs.filter((c) =>
    c.componentType === "f16" && c.resultComponentType === "f32" && c.subgroupSizing !== "varies"
  );
  return f16.sort((a, b) => b.M * b.N * b.K - a.M * a.N * a.K)[0];
}

/**
 * The WGSL attribute after `@workgroup_size(...)` of a kernel planned for
 * subgroups of `size`: `@subgroup_size(size)` where the kernel pins it
 * (`pin`, made from a config's `subgroupSizing: "pinned"`), else nothing. The
 * kernel header adds `enable subgroup_size_control;` where it is used.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { subgroupSizeAttribute } from "./subgroup_matrix_configs.ts";
 * assert.equal(subgroupSizeAttribute(32, true), " @subgroup_size(32)");
 * assert.equal(subgroupSizeAttribute(32, false), "");
 * ```
 */
export function subgroupSizeAttribute(size: number, pin: boolean): string {
  return pin ? ` @subgroup_size(${size})` : "";
}
