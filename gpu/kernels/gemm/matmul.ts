/**
 * Batched matmul C = op(A) · op(B) (+ bias, then activation), f32 accumulation
 * whatever the storage dtype. Operands are addressed through strides held in
 * uniforms, so the transposed variants used by backward (Aᵀ·G, G·Bᵀ) are the
 * same compiled kernel with other strides: no explicit transpose is needed.
 * The tilings come from `tilings.ts`; the vec4 one binds A, B and C as vec4
 * arrays and reads them as vec4 where a workgroup's tile allows.
 * Operands and results go through the dtype accessors of gpu/device/kernel.ts
 * (`ld_a`, `ld4_a`, `st_c`, ...), so one source serves f32, f16 and bf16.
 * A product of few result tiles and a long reduction (a weight gradient)
 * is split along k (split-K, see `gemmSlices`): each slice of k writes f32
 * partial results and a reduction adds them into C (in C's dtype, bf16 too).
 */
import type { DType, FloatDType } from "../../base/dtype.ts";
import { matmulSettings, type MatmulTiling } from "./settings.ts";
import { defineKernel, optional } from "../../device/kernel.ts";
import { type MatmulProblem, tilingFor } from "./matmul_class.ts";

export type { MatmulProblem, OperandLayout } from "./matmul_class.ts";
import { DeviceArray } from "../../device/device_array.ts";
import type { Activation } from "../wgsl/math.ts";
import { checkGemmLoops, gemmGrid, type GemmIo, gemmSplit, gemmWgsl, sliceLength } from "./gemm.ts";
import { shapeOf, type ShapePick, shapePickFor } from "./shape_picks.ts";
import type { GemmVectorIo } from "./gemm_io.ts";
import { kindFamily, tilingKind, tilingName } from "./tilings.ts";
import { DTypeError, fail, ShapeError } from "../../base/errors.ts";
import { launchReduceInto } from "../reduce.ts";
import { type Shape, sizeOf } from "../../base/shape.ts";

/**
 * The run of k an f16 matmul sums in f16 under `f16Accumulation: "chunked"`
 * (at most the tiling's TK). Its error bound is in the README; see
 * tests/gpu/kernels/f16_accumulation_test.ts.
 */
export const F16_CHUNK = 8;

/** Everything that changes the generated matmul code. */
export type MatmulConfig = MatmulTiling & {
  /** Blocked tiling: the index along which A's elements are contiguous (see `GemmIo`); else "k". */
  aAlong: "k" | "row";
  /** Blocked tiling: the same for B; else "col". */
  bAlong: "k" | "col";
  /** Blocked tiling with f16 operands: products summed in f16 over runs of this many k (0: f32). */
  f16Chunk: number;
  /** Storage dtype of A and B. */
  dtype: DType;
  /** Storage dtype of C. */
  out: DType;
  /** Bias dtype, or "none". */
  bias: DType | "none";
  /** Activation after the bias. */
  activation: Activation;
};

// Sizes, the batch count and the length of each slice of k, then element
// strides (batch, row, column) of A, B and C.
const UNIFORMS = {
  m: "u32",
  n: "u32",
  k: "u32",
  batch: "u32",
  k_slice: "u32",
  a_batch: "u32",
  a_row: "u32",
  a_col: "u32",
  b_batch: "u32",
  b_row: "u32",
  b_col: "u32",
  c_batch: "u32",
  vec4_loads: "u32",
} as const;

/**
 * Strided operands: A[row, k] = a[b·a_batch + row·a_row + k·a_col], and
 * likewise B; C dense. z counts (slice, batch b): slice s sums k from
 * s·k_slice, writing its own C (one slice: C itself).
 */
function stridedIo(c: MatmulConfig): GemmIo {
  const vector = tilingKind(c).vectorOperands;
  // Element i of an operand bound as vec4s is component i % 4 of vec4 i / 4
  // (bf16: of the two words `ld4_` widens).
  const load = (name: string, i: string) =>
    !vector
      ? `ld_${name}(${i})`
      : c.dtype === "bf16"
      ? `ld4_${name}((${i}) / 4u)[(${i}) % 4u]`
      : `f32(${name}[(${i}) / 4u][(${i}) % 4u])`;
  return {
    setup: `let zb = z % p.batch;
  let k_first = (z / p.batch) * p.k_slice;
  let k_count = min(p.k_slice, p.k - k_first);
  let a_base = zb * p.a_batch + k_first * p.a_col;
  let b_base = zb * p.b_batch + k_first * p.b_row;
  let c_base = z * p.c_batch;`,
    kCount: "k_count",
    aRow: (i, row) => `let ao${i} = a_base + ${row} * p.a_row;`,
    bCol: (j, col) => `let bo${j} = b_base + ${col} * p.b_col;`,
    aLoad: (i) => `ld_a(ao${i} + k * p.a_col)`,
    bLoad: (j) => `ld_b(bo${j} + k * p.b_row)`,
    aAt: (row, k) => load("a", `a_base + ${row} * p.a_row + ${k} * p.a_col`),
    bAt: (k, col) => load("b", `b_base + ${k} * p.b_row + ${col} * p.b_col`),
    store: (row, col, v) => {
      const i = `c_base + ${row} * p.n + ${col}`;
      return vectorOut(c) ? `c[(${i}) / 4u][(${i}) % 4u] = ${c.out}(${v});` : `st_c(${i}, ${v});`;
    },
    bias: c.bias === "none" ? undefined : (_row, col) => `ld_bias(${col})`,
    tileType: c.dtype === "f16" ? "f16" : "f32",
    f16Chunk: c.f16Chunk,
    aAlong: c.aAlong,
    bAlong: c.bAlong,
    vector: vector ? vectorIo(c) : undefined,
  };
}

/**
 * Vec4 access for the vec4 tiling: the first element's index over 4 is the
 * vec4's (`p.vec4_loads` says the strides keep it aligned, see
 * {@link vec4Aligned}; C is aligned when n is a multiple of 4).
 */
function vectorIo(c: MatmulConfig): GemmVectorIo {
  return {
    aligned: "p.vec4_loads != 0u",
    aVec: (row, k) => `ld4_a((a_base + ${row} * p.a_row + ${k} * p.a_col) / 4u)`,
    bVec: (k, col) => `ld4_b((b_base + ${k} * p.b_row + ${col} * p.b_col) / 4u)`,
    storeAligned: "p.n % 4u == 0u",
    storeVec: (row, col, v) => {
      const i = `c_base + ${row} * p.n + ${col}`;
      // A bf16 C is bound by element (see `vectorOut`): four aligned elements are two whole words.
      return vectorOut(c)
        ? `st4_c((${i}) / 4u, ${v});`
        : `{ let w = (${i}) / 2u; let s = ${v}; st2_c(w, s.xy); st2_c(w + 1u, s.zw); }`;
    },
    biasVec: c.bias === "none"
      ? undefined
      : (col) => `vec4<f32>(${range4.map((i) => `ld_bias(${col} + ${i}u)`).join(", ")})`,
  };
}

const range4 = [0, 1, 2, 3];

/**
 * Whether C is bound as vec4s: with the vec4 tiling, unless C is bf16. Two
 * bf16 values share a word, and an edge tile's single-element stores (n not
 * a multiple of 4) need the atomics of an element binding's `st_c`, which a
 * `vec4<bf16>` binding (plain words) has not.
 */
function vectorOut(c: MatmulConfig): boolean {
  return tilingKind(c).vectorOperands && c.out !== "bf16";
}

/**
 * Whether an operand laid out as `o` can be read as aligned vec4s along the
 * index `along` names: stride 1 there, and every other stride (batch, the
 * other index, a split's k offset) a multiple of 4.
 */
function vec4Aligned(
  o: { batch: number; row: number; col: number },
  contiguous: "row" | "col",
): boolean {
  const [unit, other] = contiguous === "col" ? [o.col, o.row] : [o.row, o.col];
  return unit === 1 && other % 4 === 0 && o.batch % 4 === 0;
}

/** The matmul kernel family (named apart per tiling kind where it says: `kindFamily`). */
export const matmulKernel = defineKernel({
  name: "matmul",
  bindings: (c: MatmulConfig) => {
    const vector = tilingKind(c).vectorOperands;
    const type = (d: DType) => vector ? `vec4<${d as FloatDType}>` as const : d;
    return [
      { name: "a", type: type(c.dtype) },
      { name: "b", type: type(c.dtype) },
      { name: "c", type: vectorOut(c) ? type(c.out) : c.out, write: true },
      ...optional(c.bias !== "none", { name: "bias", type: c.bias as DType }),
    ];
  },
  uniforms: UNIFORMS,
  source: (c) => gemmWgsl(c, stridedIo(c), c.activation),
});

/**
 * C = A·B for a resolved problem as a new array of `result.shape` (batch·m·n
 * elements, contiguous [batch, m, n]) and `result.dtype` (default A's), with
 * the bias/activation epilogue: {@link launchMatmulInto} into an array it
 * allocates. No autograd.
 */
export function launchMatmul(
  problem: MatmulProblem,
  a: DeviceArray,
  b: DeviceArray,
  result: { shape: Shape; dtype?: DType },
  epilogue: { bias?: DeviceArray; activation?: Activation } = {},
): DeviceArray {
  const { batch, m, n } = problem;
  if (sizeOf(result.shape) !== batch * m * n) {
    fail(
      ShapeError,
      "matmul",
      `a result of shape [${result.shape}] cannot hold ${batch}·${m}·${n}.`,
    );
  }
  const c = DeviceArray.empty(result.shape, result.dtype ?? a.dtype, a.gpu);
  try {
    launchMatmulInto(problem, a, b, c, epilogue);
  } catch (e) {
    c.dispose();
    throw e;
  }
  return c;
}

/**
 * Records C = A·B for a resolved problem into the caller's `c` (contiguous
 * [batch, m, n], overwritten): the tuners and benchmarks time one operand again and again.
 * The tiling and split are, in order: `forced` (a tiling, or a tiling and
 * slice count: the tuners and benchmarks pass one); on GPUs the pick tuned
 * for this exact shape (`shape_picks.ts`); the winner of the problem's class
 * with the default split. Without a per-shape pick a long reduction over few
 * result tiles is split along k ({@link gemmSlices}); with an epilogue never.
 */
export function launchMatmulInto(
  problem: MatmulProblem,
  a: DeviceArray,
  b: DeviceArray,
  c: DeviceArray,
  epilogue: { bias?: DeviceArray; activation?: Activation } = {},
  forced?: MatmulTiling | ShapePick,
): void {
  const { batch, m, n, k } = problem;
  if (batch * m * n === 0) return;
  const gpu = a.gpu;
  const activation = epilogue.activation ?? "none";
  const bias = epilogue.bias?.dtype ?? "none";
  const pick: { tiling: MatmulTiling; slices?: number } = forced
    ? ("variant" in forced ? { tiling: forced } : forced)
    : shapePickFor(
      gpu,
      problem,
      () => shapeOf(problem, { dtype: a.dtype, out: c.dtype }, { bias, activation }),
    ) ?? { tiling: tilingFor(gpu, problem, a.dtype) };
  const tiling = pick.tiling;
  const takes = tilingKind(tiling).dtypes;
  if (takes && !takes.includes(a.dtype as FloatDType)) {
    fail(
      DTypeError,
      "matmul",
      `the tiling ${tilingName(tiling)} takes ${takes.join(" or ")} operands, not ${a.dtype}. ` +
        "Force it only for those (tilingFor falls back where it cannot run).",
    );
  }
  const [gx, gy] = gemmGrid(tiling, m, n, 1);
  // The epilogue acts on whole sums, so only plain products are split.
  const split = bias !== "none" || activation !== "none"
    ? { length: k, slices: 1 }
    : pick.slices === undefined
    ? gemmSplit(gpu, tiling, problem, batch)
    : sliceLength(k, pick.slices, tiling);
  checkGemmLoops(gpu, split.length, tiling, "matmul");
  // Slices write f32 partial results [slices, batch, m, n], added into c below.
  const out = split.slices > 1 ? DeviceArray.empty([split.slices * batch * m * n], "f32", gpu) : c;
  const kind = tilingKind(tiling);
  const config: MatmulConfig = {
    ...tiling,
    // Only the blocked tilings order their loads by layout: others need one kernel for all.
    aAlong: kind.layoutAware && problem.a.row === 1 && problem.a.col !== 1 ? "row" : "k",
    bAlong: kind.layoutAware && problem.b.col !== 1 && problem.b.row === 1 ? "k" : "col",
    f16Chunk:
      kind.f16Chunks && a.dtype === "f16" && matmulSettings.of(gpu).f16Accumulation === "chunked"
        ? Math.min(F16_CHUNK, tiling.tk)
        : 0,
    dtype: a.dtype,
    out: out.dtype,
    bias,
    activation,
  };
  const kernel = gpu.kernel(kindFamily(matmulKernel, tiling), config);
  const { a: la, b: lb } = problem;
  gpu.dispatch(
    kernel,
    { a, b, c: out, ...(epilogue.bias && { bias: epilogue.bias }) },
    {
      m,
      n,
      k,
      batch,
      k_slice: split.length,
      a_batch: la.batch,
      a_row: la.row,
      a_col: la.col,
      b_batch: lb.batch,
      b_row: lb.row,
      b_col: lb.col,
      c_batch: m * n,
      vec4_loads: vec4Aligned(la, config.aAlong === "k" ? "col" : "row") &&
          vec4Aligned(lb, config.bAlong === "k" ? "row" : "col")
        ? 1
        : 0,
    },
    [gx, gy, batch * split.slices],
    { flops: 2 * batch * m * n * k },
  );
  if (out === c) return;
  launchReduceInto("sum", out, { outer: 1, axis: split.slices, inner: batch * m * n }, c);
  out.dispose();
}
