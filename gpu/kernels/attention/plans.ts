/**
 * The fused attention's plans: the sizes of a call, every candidate the tuner
 * knows, and which of them a device can run. Apart from the kernels, so the
 * per-shape picks (gpu/kernels/attention/settings.ts), which the kernels consult, can
 * list candidates without importing the kernels back.
 */
import type { Gpu } from "../../device/gpu.ts";
import type { DType } from "../../base/dtype.ts";
import {
  type AttentionTile,
  TILED_ATTENTION_TILES,
  tiledAttentionBytes,
} from "./flash_attention_tiled.ts";
import { type AttentionMatrix, attentionMatrixFor } from "./flash_attention_subgroup_matrix.ts";
import { matrixBackwardsFor } from "./flash_attention_subgroup_matrix_backward.ts";

/** How the fused attention kernels split their work: rows per workgroup, and rows staged per step. */
export interface AttentionPlan {
  /** Query (or key) rows per workgroup, one thread each. */
  rows: number;
  /**
   * Rows of the other side staged in workgroup memory per step and read by
   * every thread of the workgroup (16 or 32), or 0 to read them from storage
   * thread by thread.
   */
  stage: number;
  /**
   * Set for the register-tiled kernels (gpu/kernels/attention/flash_attention_tiled.ts),
   * which ignore `rows` and `stage`: a workgroup covers `br` rows and steps
   * over `bc` rows of the other side, each thread a `rm` × `rn` block.
   */
  tile?: AttentionTile;
  /**
   * Set for the subgroup-matrix forward (f16 only; tensor cores through
   * Dawn, gpu/kernels/attention/flash_attention_subgroup_matrix.ts): it
   * replaces the forward kernel; the backward runs the plan's other fields
   * as usual.
   */
  matrix?: AttentionMatrix;
  /**
   * Set (with `matrix`) for the subgroup-matrix backward
   * (gpu/kernels/attention/flash_attention_subgroup_matrix_backward.ts): its
   * dq and dk/dv passes replace the plan's SIMT ones, so every product of the
   * f16 attention runs on subgroup matrices. Its own subgroups and keys per
   * step (its tiles differ from the forward's).
   */
  matrixBackward?: AttentionMatrix;
}

/** Sizes of one fused attention call. */
export interface FlashAttentionShape {
  /** Batch B. */
  batch: number;
  /** Sequence length T. */
  t: number;
  /** Heads H. */
  heads: number;
  /** Head size D. */
  headSize: number;
  /** AttentionRows per workgroup and staging, or a register tile (default: the adapter's tuned plan; the tuner sets it to time candidates). */
  plan?: AttentionPlan;
}

/** AttentionRows per workgroup the tuner tries (one thread per row). */
export const ATTENTION_ROW_CANDIDATES = [16, 32, 64, 128] as const;

/** Every plan the tuner knows: each rows count, reading from storage or staging 16 or 32 rows. */
export const ATTENTION_PLAN_CANDIDATES: readonly AttentionPlan[] = [0, 16, 32].flatMap((stage) =>
  ATTENTION_ROW_CANDIDATES.map((rows) => ({ rows, stage }))
);

/** The register-tiled plans (gpu/kernels/attention/flash_attention_tiled.ts); `rows` and `stage` unused. */
export const TILED_ATTENTION_PLANS: readonly AttentionPlan[] = TILED_ATTENTION_TILES.map((
  tile,
) => ({
  rows: tile.br,
  stage: 0,
  tile,
}));

/**
 * The plans tried on `gpu` at head size D for q, k, v in `dtype`: on CPU
 * adapters only the row plans reading from storage (there a barrier costs
 * more than the shared reads save), on GPUs all row plans and the
 * register-tiled ones whose tiles fit the workgroup memory, and for f16
 * where the device has subgroup matrices the subgroup-matrix forward, paired
 * with the default row plan's and each fitting tiled plan's backward, and
 * with the subgroup-matrix backward in its two largest fitting shapes (its
 * forward's one compile serves every pairing; lavapipe, a CPU adapter, is
 * never offered it: it emulates the matrix products and compiles such a
 * kernel in seconds).
 */
export function attentionPlanCandidates(
  gpu: Gpu,
  headSize = 64,
  dtype: DType = "f32",
): readonly AttentionPlan[] {
  if (gpu.adapterProfile.cpu) return ATTENTION_PLAN_CANDIDATES.filter((p) => p.stage === 0);
  const tiled = TILED_ATTENTION_PLANS.filter((p) => tileFits(gpu, p, headSize));
  const matrix = attentionMatrixFor(gpu, headSize, dtype);
  if (!matrix) return [...ATTENTION_PLAN_CANDIDATES, ...tiled];
  const paired: AttentionPlan[] = [DEFAULT_ATTENTION_PLAN, ...tiled].map((p) => ({ ...p, matrix }));
  // The whole attention on subgroup matrices: the two largest backward shapes that fit.
  for (const matrixBackward of matrixBackwardsFor(gpu, headSize, dtype).slice(0, 2)) {
    paired.push({ ...DEFAULT_ATTENTION_PLAN, matrix, matrixBackward });
  }
  return [...ATTENTION_PLAN_CANDIDATES, ...tiled, ...paired];
}

/** Whether a tiled plan's tiles at head size D fit `gpu`'s workgroup memory and threads. */
export function tileFits(gpu: Gpu, plan: AttentionPlan, headSize: number): boolean {
  const { limits } = gpu.adapterProfile, tile = plan.tile!;
  return tiledAttentionBytes(tile, headSize) <= limits.maxComputeWorkgroupStorageSize &&
    (tile.br / tile.rm) * (tile.bc / tile.rn) <= limits.maxComputeInvocationsPerWorkgroup;
}

/** The plan before tuning (and where it was skipped). */
export const DEFAULT_ATTENTION_PLAN: AttentionPlan = { rows: 64, stage: 0 };
