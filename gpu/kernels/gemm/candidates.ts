/**
 * The matmul tilings the tuners try: CPU adapters the register, interleaved
 * and shared ones, GPUs the vec4 and blocked ones (and, for classes, every
 * one that fits); f16 products the subgroup-matrix ones where the adapter
 * has them (made from its configs, so not in {@link MATMUL_CANDIDATES}). The
 * class tuner (`class_tuner.ts`) and the per-shape tuner (`shape_tuner.ts`)
 * read them; cached picks are checked against them.
 */
import type { Gpu } from "../../device/gpu.ts";
import { DEFAULT_TILING, type MatmulTiling } from "./settings.ts";
import type { FloatDType } from "../../base/dtype.ts";
import { tilingFits, tilingKind } from "./tilings.ts";
import { subgroupMatrixTilings } from "./gemm_subgroup_matrix.ts";
import { f16MatrixConfig } from "../../device/subgroup_matrix_configs.ts";

/** The tilings CPU adapters try, register blocks first. */
const CPU_CANDIDATES: readonly MatmulTiling[] = [
  DEFAULT_TILING,
  { variant: "register", tm: 8, tn: 8, wgx: 8, wgy: 4, tk: 1 },
  { variant: "register", tm: 8, tn: 16, wgx: 4, wgy: 4, tk: 1 },
  { variant: "register", tm: 16, tn: 16, wgx: 2, wgy: 4, tk: 1 },
  { variant: "interleaved", tm: 4, tn: 4, wgx: 8, wgy: 8, tk: 1 },
  { variant: "interleaved", tm: 8, tn: 8, wgx: 8, wgy: 4, tk: 1 },
  { variant: "interleaved", tm: 8, tn: 4, wgx: 8, wgy: 8, tk: 1 },
  { variant: "interleaved", tm: 16, tn: 4, wgx: 8, wgy: 2, tk: 1 },
  { variant: "shared", tm: 4, tn: 4, wgx: 16, wgy: 16, tk: 16 },
  { variant: "shared", tm: 8, tn: 8, wgx: 8, wgy: 8, tk: 8 },
];

/**
 * Tilings tried on GPUs only. The vec4 ones are the GPU SGEMM probe's
 * fastest shapes (128×128×32 with 8×8 per thread, 128×256×16 and 128×256×8
 * with 8×16); 128×192×16 with 8×12 covers n = 384 (a GPT's qkv, projection
 * and fc2 outputs) in two tiles instead of a half-empty third 128×256;
 * 64×64×16 with 4×4 keeps small products from leaving most of a tile empty. One blocked tiling stays as the control (and for
 * convolutions, which get the blocked kernel of a vec4 tiling's shape).
 */
const GPU_CANDIDATES: readonly MatmulTiling[] = [
  { variant: "vec4", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 32 },
  { variant: "vec4", tm: 8, tn: 16, wgx: 16, wgy: 16, tk: 16 },
  { variant: "vec4", tm: 8, tn: 16, wgx: 16, wgy: 16, tk: 8 },
  { variant: "vec4", tm: 8, tn: 12, wgx: 16, wgy: 16, tk: 16 },
  { variant: "vec4", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 16 },
  { variant: "vec4", tm: 4, tn: 4, wgx: 16, wgy: 16, tk: 16 },
  { variant: "blocked", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 16 },
];

/** Every tiling the tuner knows: CPU adapters try the first ten, GPUs all. */
export const MATMUL_CANDIDATES: readonly MatmulTiling[] = [...CPU_CANDIDATES, ...GPU_CANDIDATES];

/**
 * The candidates tried on `gpu` for operands stored in `dtype`: on CPU
 * adapters the register, interleaved and shared tilings; on GPUs every one
 * whose workgroup fits the device's limits, f16 operands the
 * subgroup-matrix tilings first (where the device has them: the tuners keep
 * them only where they measure faster, and the per-shape tuner's budget
 * never leaves them out).
 */
export function matmulCandidates(gpu: Gpu, dtype: FloatDType): readonly MatmulTiling[] {
  const profile = gpu.adapterProfile;
  if (profile.cpu) return MATMUL_CANDIDATES.filter((t) => !tilingKind(t).forGpus);
  return [
    ...subgroupMatrixCandidates(gpu, dtype),
    ...MATMUL_CANDIDATES.filter((t) => tilingFits(t, dtype, profile.limits)),
  ];
}

/**
 * The subgroup-matrix tilings `gpu` can run on operands stored in `dtype`:
 * those of its f16→f32 config that fit its limits (f16 only; none without
 * the config or without subgroups, whose builtins they use). CPU adapters
 * have them too (Mesa 26's lavapipe, through Dawn), where they are tested,
 * but do not tune them: lavapipe emulates each matrix product (2–8x slower
 * than its register tilings) and compiles such a kernel in 8–25 s.
 */
export function subgroupMatrixCandidates(gpu: Gpu, dtype: FloatDType): MatmulTiling[] {
  const profile = gpu.adapterProfile;
  const config = profile.subgroups ? f16MatrixConfig(profile.subgroupMatrixConfigs) : undefined;
  return (config ? subgroupMatrixTilings(config) : [])
    .filter((t) => tilingFits(t, dtype, profile.limits));
}
