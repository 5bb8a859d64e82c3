/** Device acquisition: `initGpu()` is the first call of every program. */
export type { InitGpuOptions };
import type { FlushPolicy } from "./device/command_batch.ts";
import { Gpu, setDefaultGpu } from "./device/gpu.ts";
import { fail, GpuError, ValueError } from "./base/errors.ts";
import { backendGpu, chooseBackend, noAdapterHelp } from "./device/backend.ts";
import {
  SUBGROUP_MATRIX_FEATURE,
  SUBGROUP_SIZE_CONTROL_FEATURE,
} from "./device/subgroup_matrix_configs.ts";
import { describedAdapter } from "./device/described_adapter.ts";
import { checkInitGpuOptions, type InitGpuOptions } from "./init_options.ts";
import { matmulSettings } from "./kernels/gemm/settings.ts";
import { subgroupMatrixCandidates } from "./kernels/gemm/candidates.ts";
import { matmulClassKey } from "./kernels/gemm/matmul_class.ts";
import { attentionSettings } from "./kernels/attention/settings.ts";
import { DEFAULT_ATTENTION_PLAN } from "./kernels/attention/plans.ts";
import { attentionMatrixFor } from "./kernels/attention/flash_attention_subgroup_matrix.ts";
import { matrixBackwardsFor } from "./kernels/attention/flash_attention_subgroup_matrix_backward.ts";
import type { TuningProgress } from "./tuning/timing.ts";
import { startTuning } from "./kernels/tuning_modes.ts";
import { LAZY_TUNING_BUDGET, type TuningMode } from "./tuning/lazy.ts";
import { warnOnce } from "./base/warn_once.ts";
import { tuningStore } from "./tuning/store.ts";

/**
 * Acquires a WebGPU device with the adapter's real limits (and `shader-f16`
 * when available and wanted), starts tuning (by default lazily: the picks
 * the per-user cache holds now, the rest as each shape first runs; see
 * `InitGpuOptions.tuning`), and makes it the default device for new
 * tensors. An unknown option name or an invalid value is a `ValueError`
 * listing the valid ones, before any adapter is requested.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { Tensor } from "./tensor/tensor.ts";
 * import { ValueError } from "./base/errors.ts";
 * const gpu = await initGpu({ f16: "auto" });
 * console.log(gpu.adapterName, gpu.f16);
 * assert.equal(Tensor.from([1], [1]).gpu, gpu); // the default device for new tensors
 * await assert.rejects(initGpu({ f16: "yes" as "auto" }), ValueError); // before any adapter
 * gpu.destroy();
 * ```
 */
export async function initGpu(options: InitGpuOptions = {}): Promise<Gpu> {
  checkInitGpuOptions(options);
  const mode = options.f16 ?? "auto";
  const backend = chooseBackend(options.backend);
  if (options.adapter && backend !== "dawn-null") {
    fail(
      ValueError,
      "initGpu",
      `adapter (${options.adapter.name}) describes an adapter for Dawn's null backend only; ` +
        `the ${backend} backend's adapter reports its own facts. Add backend: "dawn-null".`,
    );
  }
  const entry = await backendGpu(backend);
  const found = await entry.requestAdapter({
    powerPreference: options.powerPreference,
  });
  if (!found) fail(GpuError, "initGpu", `no WebGPU adapter was found. ${noAdapterHelp(backend)}`);
  // On Dawn's null backend, the adapter it presents as (checkInitGpuOptions allows it nowhere else).
  const adapter = options.adapter ? describedAdapter(found, options.adapter) : found;

  const hasF16 = adapter.features.has("shader-f16");
  if (mode === "require" && !hasF16) {
    fail(
      GpuError,
      "initGpu",
      `f16 was required but the adapter (${adapter.info.description}) has no ` +
        "shader-f16. Use f16: 'auto' to fall back to f32.",
    );
  }
  const useF16 = hasF16 && mode !== "off";
  const accumulation = options.f16Accumulation ?? "f32";
  if (mode === "auto" && !hasF16) warnOnce("the adapter has no shader-f16; running in f32.");

  const requiredLimits: Record<string, number> = {};
  for (const name in adapter.limits) {
    const value = (adapter.limits as unknown as Record<string, unknown>)[name];
    if (typeof value === "number") requiredLimits[name] = value;
  }
  // timestamp-query lets gpu.profile() time each dispatch on the GPU.
  const features: GPUFeatureName[] = adapter.features.has("timestamp-query")
    ? ["timestamp-query"]
    : [];
  if (useF16) features.push("shader-f16");
  // Tensor cores (Dawn only): subgroup-matrix kernels are subgroup kernels, and pin their
  // subgroup size where the adapter lets them (see subgroup_matrix_configs.ts).
  if ((options.subgroups ?? true) && adapter.features.has(SUBGROUP_MATRIX_FEATURE)) {
    features.push(SUBGROUP_MATRIX_FEATURE);
    if (adapter.features.has(SUBGROUP_SIZE_CONTROL_FEATURE)) {
      features.push(SUBGROUP_SIZE_CONTROL_FEATURE);
    }
  }
  const device = await requestDevice(adapter, features, requiredLimits, options.subgroups ?? true);
  const directive = device.features.has("subgroups") && await acceptsSubgroupsDirective(device);
  const flush = options.flush ?? "auto";
  const gpu = new Gpu(device, adapter.info, {
    backend,
    f16: useF16,
    debug: options.debug ?? debugFromEnvironment(),
    subgroupsDirective: directive,
    flushPolicy: flush === "auto"
      ? defaultFlushPolicy(adapter.info)
      : flush === "read"
      ? { maxDispatches: Infinity, maxWork: Infinity }
      : flush,
  });
  gpu.pool.limitBytes = memoryLimit(options.memoryLimitBytes, gpu.adapterProfile.cpu);
  matmulSettings.of(gpu).f16Accumulation = accumulation;
  if (typeof options.matmulTiling === "object") {
    matmulSettings.of(gpu).tiling = options.matmulTiling;
  }
  if (options.matmulTiling === "subgroup-matrix") forceSubgroupMatrix(gpu);
  // A fixed or default tiling turns tuning off (checkInitGpuOptions refuses it with a mode).
  const tuning: TuningMode = (options.matmulTiling ?? "tune") === "tune"
    ? options.tuning ?? "lazy"
    : "off";
  const announce = tuning === "lazy" ? announceLazyTuning() : announceTuning;
  await startTuning(gpu, tuning, options.onProgress ?? announce);
  // After tuning started: the forced forward joins the f16 plan it tuned (or cached).
  if (options.attentionPlan === "subgroup-matrix") forceSubgroupMatrixAttention(gpu);
  if (options.setDefault ?? true) setDefaultGpu(gpu);
  return gpu;
}

/** Destroys `gpu` and throws the GpuError of an `option` that needs subgroup matrices. */
function failWithoutMatrices(gpu: Gpu, option: string, instead: string): never {
  gpu.destroy();
  fail(
    GpuError,
    "initGpu",
    `${option} needs f16 and an adapter with subgroup matrices of f16 into f32 ` +
      `(${gpu.adapterName} has ${gpu.f16 ? "none on this backend" : "no f16"}). Use the Dawn ` +
      "backend on a GPU whose Vulkan driver has VK_KHR_cooperative_matrix " +
      `(see docs/tensor_cores.md), or ${instead}.`,
  );
}

/**
 * `attentionPlan: "subgroup-matrix"`: the f16 plan's forward and backward on
 * subgroup matrices (at the head size the tuner times; other head sizes refit
 * them), or a `GpuError` where the device has none.
 */
function forceSubgroupMatrixAttention(gpu: Gpu): void {
  const matrix = gpu.f16 ? attentionMatrixFor(gpu, 64, "f16") : undefined;
  const [matrixBackward] = gpu.f16 ? matrixBackwardsFor(gpu, 64, "f16") : [];
  if (!matrix || !matrixBackward) {
    failWithoutMatrices(gpu, 'attentionPlan "subgroup-matrix"', 'attentionPlan "auto"');
  }
  const { plans } = attentionSettings.of(gpu);
  const { matrix: _, matrixBackward: __, ...tuned } = plans.get("f16") ?? DEFAULT_ATTENTION_PLAN;
  plans.set("f16", { ...tuned, matrix, matrixBackward });
}

/**
 * `matmulTiling: "subgroup-matrix"`: the first subgroup-matrix candidate for
 * every f16 class (other dtypes keep the default tiling), or a `GpuError`
 * where the device has none.
 */
function forceSubgroupMatrix(gpu: Gpu): void {
  const tiling = gpu.f16 ? subgroupMatrixCandidates(gpu, "f16")[0] : undefined;
  if (!tiling) failWithoutMatrices(gpu, 'matmulTiling "subgroup-matrix"', 'matmulTiling "tune"');
  const { classTilings } = matmulSettings.of(gpu);
  for (const orientation of ["nn", "nt", "tn"] as const) {
    for (const size of ["small", "medium", "large"] as const) {
      classTilings.set(matmulClassKey({ dtype: "f16", orientation, size }), tiling);
    }
  }
}

/**
 * The device, with `subgroups` when `subgroups` is asked for and granted:
 * Deno (>= 2.7) leaves it out of `adapter.features` yet grants it, so it is
 * asked for whatever the list says, and asked again without it if refused.
 */
async function requestDevice(
  adapter: GPUAdapter,
  features: GPUFeatureName[],
  requiredLimits: Record<string, number>,
  subgroups: boolean,
): Promise<GPUDevice> {
  const request = (requiredFeatures: GPUFeatureName[]) =>
    adapter.requestDevice({ label: "halfstep", requiredFeatures, requiredLimits });
  if (subgroups) {
    try {
      return await request([...features, "subgroups" as GPUFeatureName]);
    } catch { /* not granted: without it (and the subgroup-matrix kernels that need it) */ }
  }
  return await request(
    features.filter((f) => f !== SUBGROUP_MATRIX_FEATURE && f !== SUBGROUP_SIZE_CONTROL_FEATURE),
  );
}

/**
 * Whether WGSL on this runtime takes `enable subgroups;`: Chrome requires
 * the line, naga (Deno) rejects it and takes subgroup builtins without it.
 */
async function acceptsSubgroupsDirective(device: GPUDevice): Promise<boolean> {
  device.pushErrorScope("validation");
  device.createShaderModule({
    label: "halfstep subgroups probe",
    code: "enable subgroups;\n@compute @workgroup_size(1) fn main() {}",
  });
  return (await device.popErrorScope()) === null;
}

/** The default progress report of eager tuning: one line as a tuning run starts. */
function announceTuning({ task, done, total }: TuningProgress): void {
  if (done !== 0) return;
  console.info(
    `halfstep: measuring ${task} for this adapter (${total} problem${total === 1 ? "" : "s"}; ` +
      `once: the winners are kept in ${tuningStore().where}). ` +
      'initGpu({ tuning: "off" }) skips it.',
  );
}

/** The default progress report of lazy tuning: one line, the first time it measures. */
function announceLazyTuning(): (progress: TuningProgress) => void {
  let said = false;
  const { perWaitSeconds, totalSeconds } = LAZY_TUNING_BUDGET;
  return ({ done }) => {
    if (done !== 0 || said) return;
    said = true;
    console.info(
      "halfstep: tuning the kernels of this run's shapes as they first run, while it waits " +
        `(at most ${perWaitSeconds} s a wait, ${totalSeconds} s in all; once: the picks are kept ` +
        `in ${tuningStore().where}). initGpu({ tuning: "off" }) skips it.`,
    );
  };
}

/**
 * The flush policy for an adapter: submit every 32 dispatches, or sooner once
 * ~256 MB of estimated traffic is recorded. NOTE: on the CPU adapter a step
 * runs faster submitting every few dozen dispatches than only at reads (its
 * threads run while JavaScript records the rest); on GPUs the GPU would
 * otherwise idle until the step's read. The same policy serves both,
 * untuned.
 */
export function defaultFlushPolicy(_info: GPUAdapterInfo): FlushPolicy {
  return { maxDispatches: 32, maxWork: 256e6 };
}

const GIB = 2 ** 30;

/** The memory limit: the user's, or the default for the adapter (see InitGpuOptions). */
function memoryLimit(given: number | undefined, cpuAdapter: boolean): number {
  if (given !== undefined) return given; // checked by checkInitGpuOptions
  if (!cpuAdapter) return Infinity;
  try {
    // deno-lint-ignore no-explicit-any
    const deno = (globalThis as any).Deno;
    if (
      deno?.permissions?.querySync?.({ name: "sys", kind: "systemMemoryInfo" })?.state === "granted"
    ) {
      return Math.floor(deno.systemMemoryInfo().total / 2);
    }
  } catch { /* not Deno, or no permission: the fixed default */ }
  return 4 * GIB;
}

/** The debug switch: `HALFSTEP_DEBUG=1` (or `AMP_DEBUG=1`), read only where the runtime grants it without a prompt. */
function debugFromEnvironment(): boolean {
  // deno-lint-ignore no-explicit-any
  const deno = (globalThis as any).Deno;
  return ["HALFSTEP_DEBUG", "AMP_DEBUG"].some((variable) => {
    try {
      const state = deno?.permissions?.querySync?.({ name: "env", variable })?.state;
      return state === "granted" && ["1", "true"].includes(deno.env.get(variable) ?? "");
    } catch {
      return false;
    }
  });
}
