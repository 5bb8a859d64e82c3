/**
 * Matmul classes: what the tuner picks a tiling for, and how dispatch finds
 * the tiling of the problem at hand. A class is (storage dtype, orientation,
 * size): a linear layer runs x·Wᵀ forward and g·W, gᵀ·x backward, and the
 * best tiling differs between them and with the problem's size.
 */
import type { Gpu } from "../../device/gpu.ts";
import type { DType, FloatDType } from "../../base/dtype.ts";
import { tilingKind, tilingName } from "./tilings.ts";
import { DEFAULT_TILING, matmulSettings, type MatmulTiling } from "./settings.ts";
import { noteUntuned } from "../../tuning/lazy.ts";

export { tilingName };

/** A resolved matmul: sizes and each operand's element strides (batch, row, column). */
export interface MatmulProblem {
  /** Batch count. */
  batch: number;
  /** Rows of the result. */
  m: number;
  /** Columns of the result. */
  n: number;
  /** The inner size. */
  k: number;
  /** How A is laid out. */
  a: OperandLayout;
  /** How B is laid out. */
  b: OperandLayout;
}

/** How one operand is laid out in memory: element strides per batch, row and column. */
export interface OperandLayout {
  /** Stride between batches (0: shared by every batch). */
  batch: number;
  /** Stride between rows of op(X). */
  row: number;
  /** Stride between columns of op(X). */
  col: number;
}

/** Which operand is read transposed: A·B, A·Bᵀ, Aᵀ·B (Aᵀ·Bᵀ counts as Aᵀ·B). */
export type MatmulOrientation = "nn" | "nt" | "tn";

/** Size classes by multiply-adds (batch·m·n·k): < 2^22, < 2^28, and larger. */
export type MatmulSize = "small" | "medium" | "large";

/** A matmul class: what a tiling is chosen for. */
export interface MatmulClass {
  /** Storage dtype of A and B. */
  dtype: FloatDType;
  /** Which operand is transposed. */
  orientation: MatmulOrientation;
  /** Size class. */
  size: MatmulSize;
}

/**
 * A contiguous problem of `batch` products m × n over k in `orientation`
 * (operands laid out as `matmul` stores them; for the tuners' scratch runs).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { denseProblem } from "./matmul_class.ts";
 * const p = denseProblem({ batch: 1, m: 2, n: 3, k: 4 }, "nt");
 * assert.equal(p.b.row, 1);
 * assert.equal(p.b.col, 4);
 * ```
 */
export function denseProblem(
  dims: { batch: number; m: number; n: number; k: number },
  orientation: MatmulOrientation,
): MatmulProblem {
  const { batch, m, n, k } = dims;
  const transA = orientation === "tn", transB = orientation === "nt";
  return {
    batch,
    m,
    n,
    k,
    a: { batch: m * k, row: transA ? 1 : k, col: transA ? m : 1 },
    b: { batch: k * n, row: transB ? 1 : n, col: transB ? k : 1 },
  };
}

/** The class key of a problem (used by dispatch and the cache). */
export function matmulClassKey(c: MatmulClass): string {
  return `${c.dtype}/${c.orientation}/${c.size}`;
}

/** The class of `problem` with operands stored in `dtype`. */
export function classOf(problem: MatmulProblem, dtype: DType): MatmulClass {
  // A is read transposed when its row stride is 1 (and it is not a single column).
  const transA = problem.a.row === 1 && problem.k > 1;
  const transB = problem.b.col !== 1 && problem.n > 1;
  const macs = problem.batch * problem.m * problem.n * problem.k;
  return {
    dtype: dtype === "i32" ? "f32" : dtype,
    orientation: transA ? "tn" : transB ? "nt" : "nn",
    size: macs < 2 ** 22 ? "small" : macs < 2 ** 28 ? "medium" : "large",
  };
}

/** The task under which the class tuner's work is reported and noted for lazy tuning. */
export const MATMUL_CLASS_TASK = "matmul tilings";

/**
 * The size classes tuned on `gpu`: every one on GPUs; on CPU adapters the
 * medium one only (a large problem takes seconds per candidate there, and
 * their winners agree with the medium ones), whose winner the others use.
 */
export function tunedSizes(gpu: Gpu): MatmulSize[] {
  return gpu.adapterProfile.cpu ? ["medium"] : ["small", "medium", "large"];
}

/**
 * The tiling dispatch uses for `problem`: the tuned winner of its class, else
 * of the medium class beside it, else the device's default; one that cannot
 * take `dtype` (a subgroup-matrix tiling given for every product, and an f32
 * one) gives way to `DEFAULT_TILING`. A class tuned on this adapter that has
 * no winner yet is noted for lazy tuning.
 */
export function tilingFor(gpu: Gpu, problem: MatmulProblem, dtype: DType): MatmulTiling {
  const { tiling, classTilings } = matmulSettings.of(gpu);
  const c = classOf(problem, dtype);
  const chosen = classTilings.get(matmulClassKey(c)) ?? untunedTiling(gpu, problem, c, tiling);
  return (tilingKind(chosen).dtypes ?? [c.dtype]).includes(c.dtype) ? chosen : DEFAULT_TILING;
}

/** The tiling of a class without a winner of its own: the medium winner beside it, else `tiling`. */
function untunedTiling(
  gpu: Gpu,
  problem: MatmulProblem,
  c: MatmulClass,
  tiling: MatmulTiling,
): MatmulTiling {
  const { classTilings } = matmulSettings.of(gpu);
  // A class not tuned here (a small or large product on a CPU adapter): the medium winner.
  const medium = { ...c, size: "medium" as const };
  const nearest = classTilings.get(matmulClassKey(medium));
  const tuned = tunedSizes(gpu).includes(c.size) ? c : medium;
  if (tuned === c || !nearest) {
    const { batch, m, n, k } = problem;
    noteUntuned(gpu, MATMUL_CLASS_TASK, matmulClassKey(tuned), tuned, batch * m * n * k);
  }
  return nearest ?? tiling;
}

/** The tiling of every tuned class by class key, and the default's, as names (for logs). */
export function tilingNames(gpu: Gpu): Record<string, string> {
  const { tiling, classTilings } = matmulSettings.of(gpu);
  const named = [...classTilings].map(([c, t]) => [c, tilingName(t)]);
  return { default: tilingName(tiling), ...Object.fromEntries(named) };
}
