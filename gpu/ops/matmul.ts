/**
 * Differentiable matmul (the linear layer op is in `linear.ts`). Backward
 * reuses the same kernel with transposed operand strides: dA = G·op(B)ᵀ,
 * dB = op(A)ᵀ·G.
 */
import type { DType } from "../base/dtype.ts";
import { ShapeError } from "../base/errors.ts";
import { record } from "../tensor/autograd.ts";
import { launchMatmul, type MatmulProblem } from "../kernels/gemm/matmul.ts";
import { Tensor } from "../tensor/tensor.ts";
import { autocastInputs } from "../tensor/autocast_hook.ts";
import { assertSameDtype, assertSameGpu, assertTensors } from "./checks.ts";

/** Options of {@link matmul}. */
export interface MatmulOptions {
  /** Use Aᵀ: `a` is stored [.., K, M] (default false). */
  transA?: boolean;
  /** Use Bᵀ: `b` is stored [.., N, K] (default false). */
  transB?: boolean;
}

/** A product resolved from its operands: the problem and the result shape. */
export interface Resolved {
  problem: MatmulProblem;
  shape: number[];
}

/** Sizes and strides of op(A)·op(B), or a clear error. */
export function resolve(
  op: string,
  a: Tensor,
  b: Tensor,
  transA: boolean,
  transB: boolean,
): Resolved {
  assertTensors(op, a, b);
  assertSameGpu(op, a, b);
  assertSameDtype(op, a, b);
  const fail = (why: string) =>
    new ShapeError(
      `${op}: cannot multiply ${a.describe()}${transA ? "ᵀ" : ""} by ` +
        `${b.describe()}${transB ? "ᵀ" : ""}: ${why}.`,
    );
  if (a.rank < 2 || a.rank > 3 || b.rank < 2 || b.rank > 3) {
    throw fail("operands must be matrices [M, K] or batches of matrices [B, M, K]");
  }
  if (a.rank === 2 && b.rank === 3) {
    throw fail("a batched right operand needs a batched left operand; reshape A to [1, M, K]");
  }
  const [ar, ac] = a.shape.slice(-2), [br, bc] = b.shape.slice(-2);
  const [m, k] = transA ? [ac, ar] : [ar, ac];
  const [kb, n] = transB ? [bc, br] : [br, bc];
  if (k !== kb) throw fail(`inner sizes ${k} and ${kb} differ`);
  const batch = a.rank === 3 ? a.shape[0] : 1;
  if (b.rank === 3 && b.shape[0] !== batch) throw fail("batch sizes differ");
  return {
    problem: {
      batch,
      m,
      n,
      k,
      a: { batch: a.rank === 3 ? m * k : 0, row: transA ? 1 : k, col: transA ? m : 1 },
      b: { batch: b.rank === 3 ? k * n : 0, row: transB ? 1 : n, col: transB ? k : 1 },
    },
    shape: a.rank === 3 ? [batch, m, n] : [m, n],
  };
}

/** op(a)·op(b) as a new tensor of dtype `out` (f32 accumulation either way), no autograd. */
export function product(
  a: Tensor,
  b: Tensor,
  transA: boolean,
  transB: boolean,
  out: DType = a.dtype,
): Tensor {
  const { problem, shape } = resolve("matmul", a, b, transA, transB);
  return Tensor.adopt(launchMatmul(problem, a, b, { shape, dtype: out }));
}

/**
 * Gradient of a right operand shared by every batch (B is [K, N] while A is
 * [batch, M, K]): Σ over batches of op(A_i)ᵀ·G_i, computed as one product by
 * viewing A and G as [batch·M, ·].
 */
function sharedRightGrad(a: Tensor, g: Tensor, transA: boolean, transB: boolean): Tensor {
  if (transA) {
    throw new ShapeError(
      `matmul backward: a transposed batched A (${a.describe()}) with a shared B is not ` +
        "supported; make B batched or store A untransposed.",
    );
  }
  const rows = a.shape[0] * a.shape[1];
  const a2 = a.share([rows, a.shape[2]]), g2 = g.share([rows, g.shape[2]]);
  try {
    return transB ? product(g2, a2, true, false) : product(a2, g2, true, false);
  } finally {
    a2.dispose();
    g2.dispose();
  }
}

/** The gradients of op(A)·op(B) from the output gradient g (only those `needs` asks for). */
function matmulGrads(
  a: Tensor,
  b: Tensor,
  g: Tensor,
  transA: boolean,
  transB: boolean,
  needs: readonly boolean[],
): (Tensor | null)[] {
  // dop(A) = G·op(B)ᵀ; stored transposed when A is: dA = op(B)·Gᵀ.
  const ga = !needs[0]
    ? null
    : transA
    ? product(b, g, transB, true)
    : product(g, b, false, !transB);
  // dop(B) = op(A)ᵀ·G; stored transposed when B is: dB = Gᵀ·op(A).
  let gb: Tensor | null = null;
  if (!needs[1]) gb = null;
  else if (b.rank === 2 && a.rank === 3) gb = sharedRightGrad(a, g, transA, transB);
  else gb = transB ? product(g, a, true, transA) : product(a, g, !transA, false);
  return [ga, gb];
}

/**
 * Matrix product op(a)·op(b) with f32 accumulation. Shapes: [M, K]·[K, N],
 * [B, M, K]·[B, K, N], or [B, M, K]·[K, N] (B shared). `transA`/`transB` read
 * an operand as transposed without copying it.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, matmul, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const a = Tensor.from([1, 2, 3, 4], [2, 2]), b = Tensor.from([5, 6, 7, 8], [2, 2]);
 * const c = matmul(a, b); // [M, K]·[K, N]
 * assert.equal((await c.read()).join(), "19,22,43,50");
 * const q = Tensor.from([1, 0, 0, 1, 1, 1], [1, 3, 2]), k = q;
 * const s = matmul(q, k, { transB: true }); // [B, T, D]·[B, T, D]ᵀ → [B, T, T]
 * assert.equal(s.shape.join(), "1,3,3");
 * gpu.destroy();
 * ```
 */
export function matmul(a0: Tensor, b0: Tensor, options: MatmulOptions = {}): Tensor {
  const [a, b] = autocastInputs("matmul", [a0, b0]);
  const transA = options.transA ?? false, transB = options.transB ?? false;
  const c = product(a, b, transA, transB);
  return record({
    op: "matmul",
    inputs: [a, b],
    output: c,
    save: [a, b],
    backward: (g, [sa, sb], needs) => matmulGrads(sa, sb, g, transA, transB, needs),
  });
}
