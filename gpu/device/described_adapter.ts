/**
 * An adapter that is not here, described: what a real adapter reports
 * through Dawn (its info, subgroup sizes, subgroup-matrix shapes, features
 * and limits) laid over Dawn's null backend, which compiles and validates
 * every shader and pipeline and executes nothing. `initGpu({ backend:
 * "dawn-null", adapter })` then builds the device the way it builds any
 * other: it reads the described facts from the adapter and the device, as
 * a user's device's are read, so every choice the library makes there (the
 * adapter profile, the tuners' candidates, the attention plans, workgroup
 * sizes, subgroup pinning) is the one it makes on that GPU, and each
 * pipeline it builds goes through Tint and Dawn's pipeline rules. The known
 * descriptions are in known_adapters.ts.
 *
 * What the null device cannot take: it has WebGPU's default limits (16 KiB of
 * workgroup memory, 256 invocations, 8 storage buffers a stage), so it is
 * asked for the described limits capped at its own, and a pipeline beyond
 * its own but within the described ones fails there with Dawn's message
 * naming the figure; a caller that compiles for the description judges that
 * figure against {@link describedLimits} (tests/gpu/device/null_backend_compile_test.ts).
 * Subgroup-matrix shapes are not checked against the configs on the null
 * device (it lists none); the kernels take them from the described ones.
 * Alignment limits (`min…`) stay the null device's own: they lay out buffers,
 * not kernels.
 */

/** One subgroup-matrix shape as Dawn lists it (`GPUSubgroupMatrixConfig`). */
export interface DescribedMatrixConfig {
  /** The operands' component type. */
  componentType: "f16" | "f32" | "u8" | "i8";
  /** The result's component type. */
  resultComponentType: "f16" | "f32" | "u32" | "i32";
  /** Rows of the left operand and of the result. */
  M: number;
  /** Columns of the right operand and of the result. */
  N: number;
  /** The reduction. */
  K: number;
}

/** What an adapter reports through Dawn, as data. */
export interface AdapterDescription {
  /** A short name (`"nvidia-h100"`): logs, test names, tuning-cache keys. */
  name: string;
  /** Where the figures come from (a measurement, or Dawn's source). */
  source: string;
  /** `GPUAdapterInfo` as Dawn fills it, with its subgroup-matrix configs. */
  info: {
    vendor: string;
    architecture: string;
    device: string;
    description: string;
    isFallbackAdapter: boolean;
    subgroupMinSize: number;
    subgroupMaxSize: number;
    subgroupMatrixConfigs: readonly DescribedMatrixConfig[];
  };
  /** The adapter's features (those halfstep asks for, at least). */
  features: readonly string[];
  /** Its limits, where they differ from WebGPU's defaults. */
  limits: Readonly<Partial<Record<keyof GPUSupportedLimits, number>>>;
}

/** The limits of `description` over `base`'s (the null adapter's, which are WebGPU's defaults). */
export function describedLimits(
  description: AdapterDescription,
  base: GPUSupportedLimits,
): Record<string, number> {
  const limits: Record<string, number> = {};
  for (const name in base) {
    const value = (base as unknown as Record<string, unknown>)[name];
    if (typeof value === "number") limits[name] = value;
  }
  return { ...limits, ...description.limits } as Record<string, number>;
}

/**
 * `base` (an adapter of Dawn's null backend) presenting itself as
 * `description`: its info, features and limits are the described ones, and
 * its devices report the described limits and the features granted while
 * the null device below validates and records their work (see the module
 * comment). A feature or limit beyond the description is refused, as a real
 * adapter refuses it.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../mod.ts";
 * import { KNOWN_ADAPTERS } from "./known_adapters.ts";
 * const gpu = await initGpu({ backend: "dawn-null", adapter: KNOWN_ADAPTERS["nvidia-h100"] });
 * assert.equal(gpu.adapterProfile.limits.maxComputeWorkgroupStorageSize, 49152);
 * assert.deepEqual(gpu.subgroupMatrixConfigs.map((c) => c.M), [16, 16, 16, 16, 16, 16]);
 * gpu.destroy();
 * ```
 */
export function describedAdapter(base: GPUAdapter, description: AdapterDescription): GPUAdapter {
  const features = new Set(
    description.features.filter((f) => base.features.has(f as GPUFeatureName)),
  );
  const limits = describedLimits(description, base.limits);
  const adapter = {
    info: { ...description.info } as unknown as GPUAdapterInfo,
    features: features as unknown as GPUSupportedFeatures,
    limits: limits as unknown as GPUSupportedLimits,
    isFallbackAdapter: description.info.isFallbackAdapter,
    async requestDevice(request: GPUDeviceDescriptor = {}): Promise<GPUDevice> {
      const required = [...(request.requiredFeatures ?? [])];
      const missing = required.filter((f) => !features.has(f));
      if (missing.length > 0) {
        throw new TypeError(
          `requestDevice: ${description.name} has no feature ${missing.join(", ")}`,
        );
      }
      const asked = (request.requiredLimits ?? {}) as Record<string, number | undefined>;
      const own = base.limits as unknown as Record<string, number>;
      const capped: Record<string, number> = {};
      for (const [name, value] of Object.entries(asked)) {
        if (value === undefined) continue;
        // Alignments (min…) are better lower, every other limit higher.
        const alignment = name.startsWith("min");
        if (!(name in limits) || (alignment ? value < limits[name] : value > limits[name])) {
          throw new RangeError(`requestDevice: ${description.name} has no ${name} of ${value}`);
        }
        capped[name] = typeof own[name] !== "number"
          ? value
          : alignment
          ? Math.max(value, own[name])
          : Math.min(value, own[name]);
      }
      const device = await base.requestDevice({ ...request, requiredLimits: capped });
      // The device's own alignments: buffers are laid out on the device below.
      const reported: Record<string, number> = { ...limits, ...asked } as Record<string, number>;
      for (const name in reported) {
        if (name.startsWith("min")) {
          reported[name] = (device.limits as unknown as Record<string, number>)[name];
        }
      }
      return describedDevice(device, reported);
    },
  };
  return adapter as unknown as GPUAdapter;
}

/**
 * `device` reporting `limits` as its own. Every other property is the
 * device's, and its methods run on the device itself (Dawn's objects are
 * native: they must be called on the real object).
 */
function describedDevice(device: GPUDevice, limits: Record<string, number>): GPUDevice {
  const bound = new Map<PropertyKey, unknown>();
  return new Proxy(device, {
    get(target, property) {
      if (property === "limits") return limits;
      const value = Reflect.get(target, property, target);
      if (typeof value !== "function") return value;
      let method = bound.get(property);
      if (!method) bound.set(property, method = value.bind(target));
      return method;
    },
  });
}
