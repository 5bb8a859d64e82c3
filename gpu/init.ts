/** Device acquisition: `initGpu()` is the first call of every program. */
import type { FlushPolicy } from "./command_batch.ts";
import {
  type F16Accumulation,
  type F16Mode,
  Gpu,
  type MatmulTiling,
  setDefaultGpu,
} from "./device.ts";
import { fail, GpuError } from "./errors.ts";
import { checkInitGpuOptions } from "./init_options.ts";
import { wgslRuntime } from "./kernel.ts";
import { tuneMatmul } from "./matmul_tuning.ts";
import { matmulSettings } from "./matmul_settings.ts";
import { subgroupMatrixCandidates } from "./matmul_candidates.ts";
import { matmulClassKey } from "./matmul_class.ts";
import { tuneAttention } from "./attention_tuning.ts";
import { warnOnce } from "./runtime_state.ts";
import type { TuningProgress } from "./kernel_timing.ts";

/** Options for {@link initGpu}. */
export interface InitGpuOptions {
  /**
   * `"auto"` (default): use f16 when the adapter has `shader-f16`, else fall
   * back to f32 and say so once. `"require"`: fail without it. `"off"`: f32 only.
   */
  f16?: F16Mode;
  /**
   * Print generated WGSL as kernels compile (default: the `HALFSTEP_DEBUG`
   * environment variable, or its older name `AMP_DEBUG`, set to 1).
   */
  debug?: boolean;
  /**
   * The matmul tilings: `"tune"` (default) measures the candidates per matmul
   * class (dtype, orientation, size) once per adapter and caches the winners
   * (see `tuneMatmul`), and the fused attention kernels' rows per workgroup
   * likewise (`tuneAttention`); `"default"` skips both; `"subgroup-matrix"`
   * runs every f16 product on the adapter's subgroup matrices (tensor cores:
   * the first subgroup-matrix candidate; Dawn only, see docs/tensor_cores.md)
   * and skips tuning; or give one tiling for every class (attention is then
   * not tuned either).
   */
  matmulTiling?: "tune" | "default" | "subgroup-matrix" | MatmulTiling;
  /**
   * When the open batch of commands is submitted without a read:
   * `"auto"` (default) uses a policy measured for this kind of adapter (see
   * {@link defaultFlushPolicy}); `"read"` submits only when something is read;
   * or give the thresholds.
   */
  flush?: "auto" | "read" | FlushPolicy;
  /**
   * The most bytes of GPU memory the buffer pool may hold; beyond it an
   * allocation is a clear error naming the request and the usage, instead of
   * the process being killed for lack of host memory (CPU adapters keep GPU
   * memory in host memory). Default: on CPU adapters half the machine's
   * memory when the runtime can tell (`--allow-sys`), else 4 GiB; on GPUs no
   * limit (the device reports its own out-of-memory errors).
   */
  memoryLimitBytes?: number;
  /**
   * How f16 matmuls sum their products (see {@link F16Accumulation}): `"f32"`
   * (default) or `"chunked"` (f16 sums over runs of `F16_CHUNK` k, added
   * into f32; the GPU tiling only).
   */
  f16Accumulation?: F16Accumulation;
  /**
   * Ask for the `subgroups` device feature (default true): kernels then
   * reduce within subgroups where they can. Deno grants it when asked although
   * `adapter.features` may not list it, so it is always asked for; a device
   * that refuses it runs the workgroup-memory kernels. `false` forces those
   * (see `gpu.subgroups`).
   */
  subgroups?: boolean;
  /** Make this the default device for new tensors (default true). */
  setDefault?: boolean;
  /** Passed to `requestAdapter`. */
  powerPreference?: GPUPowerPreference;
  /**
   * Told how start-up tuning goes (only measurements the per-adapter cache
   * lacks; nothing when it holds every winner). Default: one line on the
   * console before the first measurement, since tuning takes seconds on a GPU
   * and up to a minute on a CPU adapter; `() => {}` silences it.
   */
  onProgress?: (progress: TuningProgress) => void;
}

const NO_ADAPTER_HELP = "On a machine without a GPU, install the Vulkan CPU driver " +
  "(Debian/Ubuntu: `apt-get install mesa-vulkan-drivers`).";

/**
 * Acquires a WebGPU device with the adapter's real limits (and `shader-f16`
 * when available and wanted), picks the matmul tiling, and makes it the
 * default device for new tensors. An unknown option name or an invalid value
 * is a `ValueError` listing the valid ones, before any adapter is requested.
 *
 * @example
 * ```ts
 * const gpu = await initGpu({ f16: "auto" });
 * console.log(gpu.adapterName, gpu.f16);
 * gpu.destroy();
 * ```
 */
export async function initGpu(options: InitGpuOptions = {}): Promise<Gpu> {
  checkInitGpuOptions(options);
  const mode = options.f16 ?? "auto";
  if (typeof navigator === "undefined" || !navigator.gpu) {
    fail(
      GpuError,
      "initGpu",
      "WebGPU is not available in this runtime (navigator.gpu is missing).",
    );
  }
  const adapter = await navigator.gpu.requestAdapter({
    powerPreference: options.powerPreference,
  });
  if (!adapter) fail(GpuError, "initGpu", `no WebGPU adapter was found. ${NO_ADAPTER_HELP}`);

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
  const device = await requestDevice(adapter, features, requiredLimits, options.subgroups ?? true);
  const directive = device.features.has("subgroups") && await acceptsSubgroupsDirective(device);
  if (directive) wgslRuntime.subgroupsDirective = true;
  const flush = options.flush ?? "auto";
  const gpu = new Gpu(device, adapter.info, {
    f16: useF16,
    f16Accumulation: accumulation,
    debug: options.debug ?? debugFromEnvironment(),
    subgroupsDirective: directive,
    flushPolicy: flush === "auto"
      ? defaultFlushPolicy(adapter.info)
      : flush === "read"
      ? { maxDispatches: Infinity, maxWork: Infinity }
      : flush,
  });
  gpu.pool.limitBytes = memoryLimit(options.memoryLimitBytes, gpu.adapterProfile.cpu);
  if (typeof options.matmulTiling === "object") {
    matmulSettings.of(gpu).tiling = options.matmulTiling;
  }
  if (options.matmulTiling === "subgroup-matrix") forceSubgroupMatrix(gpu);
  if ((options.matmulTiling ?? "tune") === "tune") {
    const onProgress = options.onProgress ?? announceTuning;
    await tuneMatmul(gpu, { onProgress });
    await tuneAttention(gpu, { onProgress });
    // The search's scratch buffers should not show up in the user's figures.
    gpu.pool.releaseCached();
    gpu.resetPeakMemory();
  }
  if (options.setDefault ?? true) setDefaultGpu(gpu);
  return gpu;
}

/**
 * `matmulTiling: "subgroup-matrix"`: the first subgroup-matrix candidate for
 * every f16 class (other dtypes keep the default tiling), or a `GpuError`
 * where the device has none.
 */
function forceSubgroupMatrix(gpu: Gpu): void {
  const tiling = gpu.f16 ? subgroupMatrixCandidates(gpu, "f16")[0] : undefined;
  if (!tiling) {
    gpu.destroy();
    fail(
      GpuError,
      "initGpu",
      `matmulTiling "subgroup-matrix" needs f16 and an adapter with subgroup matrices of f16 ` +
        `into f32 (${gpu.adapterName} has ${
          gpu.f16 ? "none on this backend" : "no f16"
        }). Use the Dawn backend on a GPU whose Vulkan driver has VK_KHR_cooperative_matrix ` +
        '(see docs/tensor_cores.md), or matmulTiling "tune".',
    );
  }
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
    } catch { /* not granted: without it */ }
  }
  return await request(features);
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

/** The default progress report: one line as a tuning run starts. */
function announceTuning({ task, done, total }: TuningProgress): void {
  if (done !== 0) return;
  console.info(
    `halfstep: measuring ${task} for this adapter (${total} problem${total === 1 ? "" : "s"}; ` +
      'once, the winners are cached). initGpu({ matmulTiling: "default" }) skips it.',
  );
}

/**
 * The flush policy for an adapter: submit every 32 dispatches, or sooner once
 * ~256 MB of estimated traffic is recorded. NOTE: on the CPU adapter
 * (lavapipe, 2 cores) a tiny GPT's AMP step ran 7–25% faster submitting every
 * 16–32 dispatches than only at reads (its threads run while JavaScript
 * records), and the MNIST MLP (~30 dispatches a step) the same; a submit costs
 * ~65 µs of JavaScript there. On GPUs the H100 figures (40–110 µs of
 * JavaScript per op, 0.1–2.5 ms of GPU per op at the GPT's size) say the GPU
 * otherwise idles until the step's read; the same policy applies, untuned.
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
