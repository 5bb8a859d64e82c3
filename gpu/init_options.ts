/**
 * `initGpu`'s options and their validation, before any adapter is requested:
 * an unknown name (a typo such as `matmulTilling`) or an invalid value is a
 * ValueError that lists what is accepted, instead of being ignored.
 */
import type { FlushPolicy } from "./device/command_batch.ts";
import type { F16Accumulation, MatmulTiling } from "./kernels/gemm/settings.ts";
import type { F16Mode } from "./device/gpu.ts";
import type { TuningProgress } from "./tuning/timing.ts";
import type { TuningMode } from "./tuning/lazy.ts";
import { type Backend, BACKENDS } from "./device/backend.ts";
import type { AdapterDescription } from "./device/described_adapter.ts";
import { fail, ValueError } from "./base/errors.ts";
import { shortValue } from "./base/short_text.ts";
import { TILING_KINDS, tilingKind } from "./kernels/gemm/tilings.ts";

/** Options for `initGpu`. */
export interface InitGpuOptions {
  /**
   * The WebGPU implementation: `"builtin"` (default: `navigator.gpu`, Deno's
   * own or the browser's) or `"dawn"` (Chrome's, from the npm package
   * `webgpu`, with subgroup matrices; see docs/dawn.md). Default: the
   * `HALFSTEP_BACKEND` environment variable where readable, else `"builtin"`.
   * `"dawn-null"` is Dawn's null backend: everything compiles and is
   * validated, nothing executes (reads return arbitrary bytes).
   */
  backend?: Backend;
  /**
   * On the `"dawn-null"` backend only: the adapter to present as (one of
   * `KNOWN_ADAPTERS`, or a description of your own), so that every kernel the
   * library would build on that GPU is built and validated here, without it
   * (see gpu/device/described_adapter.ts). Refused with any other backend: a
   * real adapter reports its own facts.
   */
  adapter?: AdapterDescription;
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
   * (see `tuneMatmul`), and the fused attention kernels' plans likewise
   * (`tuneAttention`), when {@link InitGpuOptions.tuning} says; `"default"`
   * skips both; `"subgroup-matrix"` runs every f16 product on the adapter's
   * subgroup matrices (tensor cores: the first subgroup-matrix candidate; Dawn
   * only, see docs/tensor_cores.md) and skips tuning; or give one tiling for
   * every class (attention is then not tuned either).
   */
  matmulTiling?: "tune" | "default" | "subgroup-matrix" | MatmulTiling;
  /**
   * The fused attention's plan: `"auto"` (default) as `matmulTiling` and
   * `tuning` say (tuned, cached, or the default); `"subgroup-matrix"` runs
   * its f16 forward and backward on the adapter's subgroup matrices (tensor
   * cores; Dawn only, see docs/tensor_cores.md) wherever the head size is a
   * multiple of the config's sizes (the forced f16 plan is not tuned
   * lazily), until `tuneAttentionShapes` picks per shape.
   */
  attentionPlan?: "auto" | "subgroup-matrix";
  /**
   * When kernels are tuned. `"lazy"` (default): dispatch uses the picks the
   * per-user cache holds, and a product (or attention) whose class or, on
   * GPUs, shape has none runs the default and is tuned at the next wait
   * (`gpu.sync()`, `read()`, `item()`), within a budget of 2 s a wait and
   * 60 s in all (`LAZY_TUNING_BUDGET`; products under `LAZY_MIN_WORK`
   * multiply-adds are never tuned), so a tiny model starts at once;
   * `tunePending(gpu)` tunes what is noted now. `"eager"`: every matmul
   * class and attention dtype of the adapter before `initGpu` returns
   * (seconds on a GPU, 40 s to 2 min on a CPU adapter, once). `"off"`: the
   * default tiling and plans, as `matmulTiling: "default"`. See
   * gpu/tuning/lazy.ts for what stays bit for bit.
   */
  tuning?: TuningMode;
  /**
   * When the open batch of commands is submitted without a read:
   * `"auto"` (default) uses a policy measured for this kind of adapter (see
   * `defaultFlushPolicy`); `"read"` submits only when something is read;
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
   * Told how tuning goes (only measurements the per-adapter cache lacks;
   * nothing when it holds every winner): with `tuning: "eager"` each
   * tuner's run at start-up, with `"lazy"` each wait's (`total` is the keys
   * pending as it began; the budget may leave some to a later wait).
   * Default: one line on the console before the first measurement (with
   * `"lazy"`, only the first time); `() => {}` silences it.
   */
  onProgress?: (progress: TuningProgress) => void;
}

const VARIANTS = Object.keys(TILING_KINDS);
const TILE_SIZES = ["tm", "tn", "wgx", "wgy", "tk"] as const;

/** `"a", "b" or "c"`, as messages list choices. */
function choices(values: readonly string[]): string {
  const quoted = values.map((v) => JSON.stringify(v));
  return `${quoted.slice(0, -1).join(", ")} or ${quoted.at(-1)}`;
}

/** One of `values`, or the problem. */
function oneOf(values: readonly string[]) {
  return (name: string, v: unknown) =>
    values.includes(v as string)
      ? null
      : `${name} must be ${choices(values)}, not ${shortValue(v)}`;
}

function boolean(name: string, v: unknown): string | null {
  return typeof v === "boolean" ? null : `${name} must be true or false, not ${shortValue(v)}`;
}

function matmulTiling(name: string, v: unknown): string | null {
  if (typeof v !== "object" || v === null) {
    return `${name} must be "tune", "default", "subgroup-matrix" or a tiling { variant, tm, tn, wgx, wgy, tk } ` +
      `(see MATMUL_CANDIDATES), not ${shortValue(v)}`;
  }
  const t = v as Partial<MatmulTiling>;
  if (!VARIANTS.includes(t.variant as string)) {
    return `${name}.variant must be ${choices(VARIANTS)}, not ${shortValue(t.variant)}`;
  }
  const bad = TILE_SIZES.filter((k) => !(Number.isInteger(t[k]) && (t[k] as number) >= 1));
  if (bad.length > 0) {
    return `${name}.${bad[0]} must be an integer >= 1, not ${shortValue(t[bad[0]])}`;
  }
  const problem = tilingKind(t as MatmulTiling).shapeProblem(t as MatmulTiling);
  return problem && `${name}: ${problem}`;
}

function flush(name: string, v: unknown): string | null {
  if (v === "auto" || v === "read") return null;
  const ok = (x: unknown) => typeof x === "number" && x >= 1;
  const p = v as Partial<FlushPolicy> | null;
  return typeof p === "object" && p !== null && ok(p.maxDispatches) && ok(p.maxWork) ? null : (
    `${name} must be "auto", "read" or { maxDispatches, maxWork } with both >= 1 ` +
    `(Infinity allowed), not ${shortValue(v)}`
  );
}

function positiveBytes(name: string, v: unknown): string | null {
  return typeof v === "number" && v > 0
    ? null
    : `${name} must be a number > 0, not ${shortValue(v)}`;
}

/** Every option's check; the keys are the valid option names. */
const CHECKS: Record<keyof InitGpuOptions, (name: string, v: unknown) => string | null> = {
  backend: oneOf(BACKENDS),
  adapter: (name, v) => {
    const d = v as Partial<AdapterDescription> | null;
    return typeof d === "object" && d !== null && typeof d.name === "string" &&
        typeof d.info === "object" && Array.isArray(d.features) && typeof d.limits === "object"
      ? null
      : `${name} must be an adapter description { name, info, features, limits } ` +
        `(see KNOWN_ADAPTERS), not ${shortValue(v)}`;
  },
  f16: oneOf(["auto", "require", "off"]),
  debug: boolean,
  matmulTiling: (name, v) =>
    typeof v === "string"
      ? oneOf(["tune", "default", "subgroup-matrix"])(name, v)
      : matmulTiling(name, v),
  tuning: oneOf(["lazy", "eager", "off"]),
  flush,
  memoryLimitBytes: positiveBytes,
  f16Accumulation: oneOf(["f32", "chunked"]),
  attentionPlan: oneOf(["auto", "subgroup-matrix"]),
  subgroups: boolean,
  setDefault: boolean,
  powerPreference: oneOf(["low-power", "high-performance"]),
  onProgress: (name, v) =>
    typeof v === "function" ? null : `${name} must be a function, not ${shortValue(v)}`,
};

/**
 * Throws a ValueError listing every unknown option name and invalid value of
 * `options` (undefined values count as absent).
 */
export function checkInitGpuOptions(options: unknown): void {
  if (options === undefined) return;
  if (typeof options !== "object" || options === null || Array.isArray(options)) {
    fail(ValueError, "initGpu", `options must be an object, not ${shortValue(options)}.`);
  }
  const problems: string[] = [];
  for (const [name, value] of Object.entries(options)) {
    const check = CHECKS[name as keyof InitGpuOptions];
    if (!check) {
      problems.push(
        `unknown option ${shortValue(name)}; the options are ${Object.keys(CHECKS).join(", ")}`,
      );
    } else if (value !== undefined) {
      const problem = check(name, value);
      if (problem) problems.push(problem);
    }
  }
  const { tuning, matmulTiling } = options as InitGpuOptions;
  if ((tuning === "lazy" || tuning === "eager") && (matmulTiling ?? "tune") !== "tune") {
    problems.push(
      `tuning ${shortValue(tuning)} tunes the matmul tilings, which matmulTiling ` +
        `${shortValue(matmulTiling)} fixes; give one of them`,
    );
  }
  fail(ValueError, "initGpu", problems);
}
