/**
 * Which WebGPU implementation `initGpu` takes its adapter from: the runtime's
 * own (`navigator.gpu`: Deno's built-in WebGPU, or the browser's) or Dawn
 * (gpu/device/backend_dawn.ts). What only Dawn tells, the adapter's
 * subgroup-matrix shapes (tensor cores), is read in subgroup_matrix_configs.ts.
 */
import { dawnGpu, environment } from "./backend_dawn.ts";
import { fail, GpuError, ValueError } from "../base/errors.ts";

/**
 * `"builtin"`: the runtime's WebGPU (`navigator.gpu`; in Deno, wgpu);
 * `"dawn"`: Chrome's WebGPU from the npm package `webgpu`, which has
 * subgroup matrices (see docs/dawn.md); `"dawn-null"`: Dawn's null backend,
 * which compiles and validates everything and executes nothing (reads
 * return arbitrary bytes): for compiling kernels as another adapter would
 * (`initGpu`'s `adapter`) and for timing the host's own work.
 */
export type Backend = "builtin" | "dawn" | "dawn-null";

/** The backends, as `initGpu`'s `backend` option and `HALFSTEP_BACKEND` take them. */
export const BACKENDS: readonly Backend[] = ["builtin", "dawn", "dawn-null"];

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
      `HALFSTEP_BACKEND must be ${BACKENDS.slice(0, -1).map((b) => `"${b}"`).join(", ")} or "${
        BACKENDS.at(-1)
      }", not "${named}"`,
    );
  }
  return named as Backend;
}

/** The entry point of `backend`: `navigator.gpu`, or Dawn's (loaded on first use). */
export async function backendGpu(backend: Backend): Promise<GPU> {
  if (backend === "dawn") return await dawnGpu();
  if (backend === "dawn-null") return await dawnGpu("null");
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
  return backend !== "builtin"
    ? "Dawn found no Vulkan adapter it accepts. On a machine without a GPU, Dawn needs Mesa " +
      "26's lavapipe (VK_KHR_cooperative_matrix; Mesa 22's is refused): see docs/dawn.md."
    : "On a machine without a GPU, install the Vulkan CPU driver " +
      "(Debian/Ubuntu: `apt-get install mesa-vulkan-drivers`).";
}
