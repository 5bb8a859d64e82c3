/**
 * Differentiable matmul and the fused linear layer op. Backward reuses the
 * same kernel with transposed operand strides: dA = G·op(B)ᵀ, dB = op(A)ᵀ·G.
 */
import { ShapeError } from "../errors.ts";
import { record } from "../autograd.ts";
import { launchBinary } from "../kernels/elementwise.ts";
import { dispatchMatmul, type MatmulProblem } from "../kernels/matmul.ts";
import { launchReduce } from "../kernels/reduce.ts";
import { Tensor } from "../tensor.ts";
import { autocastInputs } from "../autocast_hook.ts";
import { assertSameDtype, assertSameGpu } from "./checks.ts";

/** Options of {@link matmul}. */
export interface MatmulOptions {
  /** Use Aᵀ: `a` is stored [.., K, M] (default false). */
  transA?: boolean;
  /** Use Bᵀ: `b` is stored [.., N, K] (default false). */
  transB?: boolean;
}

interface Resolved {
  problem: MatmulProblem;
  shape: number[];
}

/** Sizes and strides of op(A)·op(B), or a clear error. */
function resolve(op: string, a: Tensor, b: Tensor, transA: boolean, transB: boolean): Resolved {
  assertSameGpu(op, a, b);
  assertSameDtype(op, a, b);
  const fail = (why: string) =>
    new RangeError(
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

/** op(a)·op(b) as a new tensor, no autograd. */
function product(a: Tensor, b: Tensor, transA: boolean, transB: boolean): Tensor {
  const { problem, shape } = resolve("matmul", a, b, transA, transB);
  const c = Tensor.empty(shape, a.dtype, a.gpu);
  dispatchMatmul(problem, a, b, c);
  return c;
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
 * import { initGpu, matmul, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const a = Tensor.from([1, 2, 3, 4], [2, 2]), b = Tensor.from([5, 6, 7, 8], [2, 2]);
 * const c = matmul(a, b); // [M, K]·[K, N]
 * console.assert((await c.read()).join() === "19,22,43,50");
 * const q = Tensor.from([1, 0, 0, 1, 1, 1], [1, 3, 2]), k = q;
 * const s = matmul(q, k, { transB: true }); // [B, T, D]·[B, T, D]ᵀ → [B, T, T]
 * console.assert(s.shape.join() === "1,3,3");
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

/** Options of {@link linear}. */
export interface LinearOptions {
  /** Bias [out] in f32 or x's dtype (default none). */
  bias?: Tensor | null;
  /** Activation fused into the matmul epilogue (default `"none"`). */
  activation?: "none" | "relu";
}

/**
 * The fused linear layer op: x·Wᵀ + bias, then an optional ReLU, in one
 * kernel. `x` is [N, in] or [B, T, in]; `weight` is [out, in] (PyTorch's
 * layout); `options.bias` is [out] in f32 or x's dtype.
 *
 * @example
 * ```ts
 * import { initGpu, linear, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2], [1, 2]); // [N, in]
 * const w1 = Tensor.from([1, 1, -1, -1], [2, 2]); // [out, in]
 * const b1 = Tensor.from([0.5, 0.5], [2]);
 * const h = linear(x, w1, { bias: b1, activation: "relu" });
 * console.assert((await h.read()).join() === "3.5,0");
 * gpu.destroy();
 * ```
 */
export function linear(x0: Tensor, weight0: Tensor, options: LinearOptions = {}): Tensor {
  // The bias stays as given: the epilogue adds an f32 bias to f16 products.
  const [x, weight] = autocastInputs("linear", [x0, weight0]);
  const activation = options.activation ?? "none";
  const bias = options.bias ?? null;
  const inFeatures = x.shape.at(-1)!;
  const rows = x.size / Math.max(inFeatures, 1);
  const x2 = x.share([rows, inFeatures]);
  let resolved: Resolved;
  try {
    resolved = resolve("linear", x2, weight, false, true);
  } catch (e) {
    x2.dispose();
    throw e;
  }
  const outFeatures = resolved.problem.n;
  if (bias && (bias.rank !== 1 || bias.shape[0] !== outFeatures)) {
    x2.dispose();
    throw new ShapeError(
      `linear: bias ${bias.describe()} must have shape [${outFeatures}] to match ` +
        `weight ${weight.describe()}.`,
    );
  }
  const y = Tensor.empty([...x.shape.slice(0, -1), outFeatures], x.dtype, x.gpu);
  dispatchMatmul(resolved.problem, x2, weight, y, { bias: bias ?? undefined, activation });
  x2.dispose();
  const inputs = bias ? [x, weight, bias] : [x, weight];
  const save = activation === "relu" ? [x, weight, y] : [x, weight];
  return record({
    op: "linear",
    inputs,
    output: y,
    save,
    backward: (g, [sx, sw, sy], needs) => {
      // ReLU's gradient from its output: y > 0 exactly where the pre-activation is.
      const gPre = activation === "relu" ? launchBinary("relu_grad", g, sy) : g;
      const g2 = gPre.share([rows, outFeatures]), xs = sx.share([rows, inFeatures]);
      let gx: Tensor | null = null;
      if (needs[0]) {
        const flat = product(g2, sw, false, false);
        gx = flat.share(x.shape);
        flat.dispose();
      }
      const gw = needs[1] ? product(g2, xs, true, false) : null;
      const gb = bias && needs[2]
        ? launchReduce("sum", g2, { outer: 1, axis: rows, inner: outFeatures }, bias.shape, {
          out: bias.dtype,
        })
        : null;
      g2.dispose();
      xs.dispose();
      if (gPre !== g) gPre.dispose();
      return bias ? [gx, gw, gb] : [gx, gw];
    },
  });
}
