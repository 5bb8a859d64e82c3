/**
 * Which WebGPU implementation `initGpu` takes its adapter from: the runtime's
 * own (`navigator.gpu`: Deno's built-in WebGPU, or the browser's) or Dawn
 * (gpu/backend_dawn.ts), and what only Dawn tells: the adapter's
 * subgroup-matrix shapes (tensor cores).
 */
import { dawnGpu, environment } from "./backend_dawn.ts";
import { fail, GpuError, ValueError } from "../base/errors.ts";

/**
 * `"builtin"`: the runtime's WebGPU (`navigator.gpu`; in Deno, wgpu);
 * `"dawn"`: Chrome's WebGPU from the npm package `webgpu`, which has
 * subgroup matrices (see docs/dawn.md).
 */
export type Backend = "builtin" | "dawn";

/** The backends, as `initGpu`'s `backend` option and `HALFSTEP_BACKEND` take them. */
export const BACKENDS: readonly Backend[] = ["builtin", "dawn"];

/**
 * One shape an adapter multiplies subgroup matrices in (a Dawn
 * `GPUSubgroupMatrixConfig`, copied field by field: Dawn's own objects are
 * native and `JSON.stringify` prints them as `{}`): an M×K `componentType`
 * left matrix times a K×N right one, summed into an M×N `resultComponentType`
 * result. Lavapipe 26 lists four, all 8×8×8 (f16→f16, f16→f32, u8→u32,
 * i8→i32); NVIDIA 16×16×16 and 16×8×16.
 */
export interface SubgroupMatrixConfig {
  /** The operands' element type: `"f16"`, `"f32"`, `"u8"`, `"i8"`... */
  componentType: string;
  /** The result's element type: `"f16"`, `"f32"`, `"u32"`, `"i32"`... */
  resultComponentType: string;
  /** Rows of the left operand and the result. */
  M: number;
  /** Columns of the right operand and the result. */
  N: number;
  /** Columns of the left operand, rows of the right. */
  K: number;
}

/** The WebGPU feature that subgroup-matrix kernels need (Dawn only, behind `allow_unsafe_apis`). */
export const SUBGROUP_MATRIX_FEATURE = "chromium-experimental-subgroup-matrix" as GPUFeatureName;

/**
 * The backend: `chosen` (initGpu's option), else the `HALFSTEP_BACKEND`
 * environment variable where the runtime grants reading it, else `"builtin"`.
 */
export function chooseBackend(chosen: Backend | undefined): Backend {
  if (chosen !== undefined) return chosen;
  const named = environment("HALFSTEP_BACKEND");
  if (named === undefined) return "builtin";
  if (!(BACKENDS as readonly string[]).includes(named)) {
    fail(
      ValueError,
      "initGpu",
      `HALFSTEP_BACKEND must be ${BACKENDS.map((b) => `"${b}"`).join(" or ")}, not "${named}"`,
    );
  }
  return named as Backend;
}

/** The entry point of `backend`: `navigator.gpu`, or Dawn's (loaded on first use). */
export async function backendGpu(backend: Backend): Promise<GPU> {
  if (backend === "dawn") return await dawnGpu();
  if (typeof navigator === "undefined" || !navigator.gpu) {
    fail(
      GpuError,
      "initGpu",
      "WebGPU is not available in this runtime (navigator.gpu is missing).",
    );
  }
  return navigator.gpu;
}

/** Why no adapter was found, and what to install. */
export function noAdapterHelp(backend: Backend): string {
  return backend === "dawn"
    ? "Dawn found no Vulkan adapter it accepts. On a machine without a GPU, Dawn needs Mesa " +
      "26's lavapipe (VK_KHR_cooperative_matrix; Mesa 22's is refused): see docs/dawn.md."
    : "On a machine without a GPU, install the Vulkan CPU driver " +
      "(Debian/Ubuntu: `apt-get install mesa-vulkan-drivers`).";
}

/**
 * The adapter's subgroup-matrix shapes as plain objects; none unless the
 * device has {@link SUBGROUP_MATRIX_FEATURE}.
 */
export function subgroupMatrixConfigsOf(
  info: GPUAdapterInfo,
  device: GPUDevice,
): SubgroupMatrixConfig[] {
  if (!device.features.has(SUBGROUP_MATRIX_FEATURE)) return [];
  const native = (info as { subgroupMatrixConfigs?: Iterable<SubgroupMatrixConfig> })
    .subgroupMatrixConfigs ?? [];
  return [...native].map((c) => ({
    componentType: c.componentType,
    resultComponentType: c.resultComponentType,
    M: c.M,
    N: c.N,
    K: c.K,
  }));
}
