/**
 * Validation of `initGpu`'s options, before any adapter is requested: an
 * unknown name (a typo such as `matmulTilling`) or an invalid value is a
 * ValueError that lists what is accepted, instead of being ignored.
 */
import type { FlushPolicy } from "./command_batch.ts";
import type { MatmulTiling } from "./device.ts";
import { fail, ValueError } from "./errors.ts";
import type { InitGpuOptions } from "./init.ts";
import { shortValue } from "./short_text.ts";
import { TILING_KINDS, tilingKind } from "./kernels/tilings.ts";

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
  f16: oneOf(["auto", "require", "off"]),
  debug: boolean,
  matmulTiling: (name, v) =>
    typeof v === "string"
      ? oneOf(["tune", "default", "subgroup-matrix"])(name, v)
      : matmulTiling(name, v),
  flush,
  memoryLimitBytes: positiveBytes,
  f16Accumulation: oneOf(["f32", "chunked"]),
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
  fail(ValueError, "initGpu", problems);
}
