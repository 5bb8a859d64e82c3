/**
 * The GEMM tilings, one record per kind: its WGSL generator, the loop
 * iterations an invocation runs (against an adapter's loop cap), the
 * workgroup memory it needs, its shape constraints and what it asks of the
 * operands. `launchMatmulInto`, the convolutions, the tuner, the candidate
 * filter, `bench tilings` and the tests read these records; nothing else
 * switches on `MatmulTiling.variant`.
 */
import type { MatmulTiling } from "./settings.ts";
import type { FloatDType } from "../../base/dtype.ts";
import type { GemmIo } from "./gemm_io.ts";
import { defineKernel, type KernelConfig, type KernelDefinition } from "../../device/kernel.ts";
import type { Activation } from "../wgsl/math.ts";
import { registerWgsl, sharedWgsl } from "./gemm_register.ts";
import { blockedTileBytes, blockedWgsl } from "./gemm_blocked.ts";
import { vec4ShapeProblem, vec4TileBytes, vec4Wgsl } from "./gemm_vec4.ts";
import {
  subgroupMatrixLoops,
  subgroupMatrixName,
  subgroupMatrixShapeProblem,
  subgroupMatrixThreads,
  subgroupMatrixTileBytes,
  subgroupMatrixWgsl,
} from "./gemm_subgroup_matrix.ts";

/** What one tiling kind is and needs. */
export interface TilingKind {
  /** The WGSL body of a GEMM kernel with tiling `t`. */
  wgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string;
  /** Loop iterations one invocation runs for a reduction over `k`. */
  loopIterations(t: MatmulTiling, k: number): number;
  /**
   * Bytes of workgroup memory with tiles in `tileType` (0: none): f16 for f16
   * operands, f32 otherwise (bf16 is widened while staged; see {@link tileTypeOf}).
   */
  workgroupBytes(t: MatmulTiling, tileType: "f32" | "f16"): number;
  /** Why the kernel cannot be built with `t`'s sizes, or null. */
  shapeProblem(t: MatmulTiling): string | null;
  /** Matmul binds A, B and C as vec4 arrays and provides `GemmIo.vector`. */
  vectorOperands: boolean;
  /** Loads follow each operand's contiguous index (`GemmIo.aAlong`, `bAlong`). */
  layoutAware: boolean;
  /** Supports f16 sums over chunks of k (`GemmIo.f16Chunk`) with f16 operands. */
  f16Chunks: boolean;
  /** Written for GPUs: CPU adapters never try it. */
  forGpus: boolean;
  /** Invocations per workgroup (default `wgx · wgy`). */
  threads?(t: MatmulTiling): number;
  /** The operand dtypes it takes (default every float dtype). */
  dtypes?: readonly FloatDType[];
  /** Its name in logs and tables (default {@link tilingName}'s common form). */
  name?(t: MatmulTiling): string;
  /** Added to a kernel family's name (`matmul_subgroup_matrix`), so profiles show the kind. */
  family?: string;
}

const multipleOf4 = (t: MatmulTiling) =>
  t.tm % 4 === 0 && t.tn % 4 === 0
    ? null
    : `the ${t.variant} variant needs tm and tn multiples of 4, not ${t.tm} and ${t.tn}`;

const REGISTER: TilingKind = {
  wgsl: registerWgsl,
  loopIterations: (_t, k) => k,
  workgroupBytes: () => 0,
  shapeProblem: () => null,
  vectorOperands: false,
  layoutAware: false,
  f16Chunks: false,
  forGpus: false,
};

/** Every tiling kind by `MatmulTiling.variant`. */
export const TILING_KINDS: Readonly<Record<MatmulTiling["variant"], TilingKind>> = {
  register: REGISTER,
  interleaved: REGISTER,
  shared: {
    ...REGISTER,
    wgsl: sharedWgsl,
    // Its tile loads loop too.
    loopIterations: (_t, k) => 2 * k,
    workgroupBytes: (t) => 4 * t.tk * (t.tm * t.wgy + t.tn * t.wgx),
  },
  blocked: {
    wgsl: blockedWgsl,
    loopIterations: (t, k) => Math.ceil(k / t.tk),
    workgroupBytes: blockedTileBytes,
    shapeProblem: multipleOf4,
    vectorOperands: false,
    layoutAware: true,
    f16Chunks: true,
    forGpus: true,
  },
  vec4: {
    wgsl: vec4Wgsl,
    loopIterations: (t, k) => Math.ceil(k / t.tk),
    // Without vec4 io (a convolution) it generates the blocked kernel of its shape.
    workgroupBytes: (t, tileType) =>
      Math.max(vec4TileBytes(t, "f32"), blockedTileBytes(t, tileType)),
    shapeProblem: vec4ShapeProblem,
    vectorOperands: true,
    layoutAware: true,
    f16Chunks: true,
    forGpus: true,
  },
  "subgroup-matrix": {
    wgsl: subgroupMatrixWgsl,
    loopIterations: subgroupMatrixLoops,
    workgroupBytes: subgroupMatrixTileBytes,
    shapeProblem: subgroupMatrixShapeProblem,
    vectorOperands: true,
    layoutAware: true,
    f16Chunks: false,
    forGpus: true,
    threads: subgroupMatrixThreads,
    dtypes: ["f16"],
    name: subgroupMatrixName,
    family: "subgroup_matrix",
  },
};

/** The families of kinds named apart, by base family and kind. */
const families = new WeakMap<object, Map<string, object>>();

/**
 * `base`, or where `t`'s kind names its kernels apart (`family`) the same
 * declaration named `${base.name}_${family}` (`matmul_subgroup_matrix`), so
 * that profiles and kernel keys show which kind ran.
 */
export function kindFamily<C extends KernelConfig, B extends string, U extends string>(
  base: KernelDefinition<C, B, U>,
  t: MatmulTiling,
): KernelDefinition<C, B, U> {
  const family = tilingKind(t).family;
  if (!family) return base;
  let named = families.get(base);
  if (!named) families.set(base, named = new Map());
  let kernel = named.get(family) as KernelDefinition<C, B, U> | undefined;
  if (!kernel) {
    named.set(family, kernel = defineKernel({ ...base, name: `${base.name}_${family}` }));
  }
  return kernel;
}

/** The record of `t`'s kind. */
export function tilingKind(t: MatmulTiling): TilingKind {
  return TILING_KINDS[t.variant];
}

/** The limits a tiling must fit (a subset of `GPUSupportedLimits`). */
export interface TilingLimits {
  /** Threads per workgroup. */
  maxComputeInvocationsPerWorkgroup: number;
  /** Workgroup memory in bytes. */
  maxComputeWorkgroupStorageSize: number;
}

/**
 * The type the workgroup tiles of operands stored in `dtype` hold: f16 keeps
 * its f16 tiles (half the memory); bf16, which WGSL lacks, is widened to f32
 * while staged, as f32 is stored.
 */
function tileTypeOf(dtype: FloatDType): "f32" | "f16" {
  return dtype === "f16" ? "f16" : "f32";
}

/**
 * Whether `t` with operands stored in `dtype` fits `limits` and its kind's
 * shape constraints. Every tiling but subgroup-matrix (f16 only) takes every
 * float dtype.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { tilingFits } from "./tilings.ts";
 * const t = { variant: "vec4", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 32 } as const;
 * const limits = { maxComputeInvocationsPerWorkgroup: 256, maxComputeWorkgroupStorageSize: 16384 };
 * assert.ok(!tilingFits(t, "bf16", limits));
 * assert.ok(tilingFits(t, "bf16", { ...limits, maxComputeWorkgroupStorageSize: 65536 }));
 * ```
 */
export function tilingFits(t: MatmulTiling, dtype: FloatDType, limits: TilingLimits): boolean {
  const kind = tilingKind(t);
  return (kind.dtypes ?? [dtype]).includes(dtype) &&
    (kind.threads?.(t) ?? t.wgx * t.wgy) <= limits.maxComputeInvocationsPerWorkgroup &&
    kind.workgroupBytes(t, tileTypeOf(dtype)) <= limits.maxComputeWorkgroupStorageSize &&
    kind.shapeProblem(t) === null;
}

/**
 * A tiling in a few characters, for logs and tables, distinct for distinct
 * tilings: `"vec4 128x128x32 t8x8"` (workgroup tile rows × columns × k-step,
 * per-thread block); the register tilings, which step k by one, print
 * `"interleaved 32x64 t8x8"`; subgroup-matrix ones
 * `"subgroup-matrix 128x128x32 s64x64 m16x16x16"` (per-subgroup block, the
 * adapter's matrix shape).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { tilingName } from "../../mod.ts";
 * const tiling = { variant: "vec4", tm: 8, tn: 16, wgx: 16, wgy: 16, tk: 8 } as const;
 * assert.equal(tilingName(tiling), "vec4 128x256x8 t8x16");
 * assert.equal(tilingName({ ...tiling, tk: 16 }), "vec4 128x256x16 t8x16");
 * ```
 */
export function tilingName(t: MatmulTiling): string {
  const named = tilingKind(t).name;
  if (named) return named(t);
  const block = `${t.tm * t.wgy}x${t.tn * t.wgx}`;
  const k = t.variant === "register" || t.variant === "interleaved" ? "" : `x${t.tk}`;
  return `${t.variant} ${block}${k} t${t.tm}x${t.tn}`;
}
