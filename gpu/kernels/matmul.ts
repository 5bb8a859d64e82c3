/**
 * Batched matmul C = op(A) · op(B) (+ bias, then activation), f32 accumulation
 * whatever the storage dtype. Operands are addressed through strides held in
 * uniforms, so the transposed variants used by backward (Aᵀ·G, G·Bᵀ) are the
 * same compiled kernel with other strides: no explicit transpose is needed.
 *
 * Two tilings, chosen per adapter (see `matmul_tuning.ts`):
 * - `register`: every thread keeps a TM×TN block of C in registers and reads
 *   A and B straight from storage. Wins on CPU adapters (lavapipe).
 * - `shared`: the workgroup stages (TM·WGY)×TK and TK×(TN·WGX) tiles in
 *   workgroup memory. The usual winner on real GPUs.
 */
import type { DType } from "../dtype.ts";
import type { MatmulTiling } from "../device.ts";
import { defineKernel, optional } from "../kernel.ts";
import { type MatmulProblem, tilingFor } from "../matmul_class.ts";

export type { MatmulProblem, OperandLayout } from "../matmul_class.ts";
import type { Tensor } from "../tensor.ts";
import { type Activation, activationExpr, WGSL_MATH } from "./wgsl_math.ts";

/** Everything that changes the generated matmul code. */
export type MatmulConfig = MatmulTiling & {
  /** Storage dtype of A and B. */
  dtype: DType;
  /** Storage dtype of C. */
  out: DType;
  /** Bias dtype, or "none". */
  bias: DType | "none";
  /** Activation after the bias. */
  activation: Activation;
};

// Sizes, then element strides (batch, row, column) of A, B and C.
const UNIFORMS = {
  m: "u32",
  n: "u32",
  k: "u32",
  a_batch: "u32",
  a_row: "u32",
  a_col: "u32",
  b_batch: "u32",
  b_row: "u32",
  b_col: "u32",
  c_batch: "u32",
} as const;

/** Stores acc[i][j] to C at (row(i), col(j)) through bias and activation, skipping edges. */
function epilogue(c: MatmulConfig, row: (i: number) => string, col: (j: number) => string): string {
  const lines: string[] = [];
  for (let i = 0; i < c.tm; i++) {
    for (let j = 0; j < c.tn; j++) {
      const acc = `acc[${i * c.tn + j}]`;
      const v = c.bias === "none" ? acc : `${acc} + f32(bias[col])`;
      lines.push(
        `{ let row = ${row(i)}; let col = ${col(j)};\n` +
          `    if (row < p.m && col < p.n) { c[c_base + row * p.n + col] = ${c.out}(${
            activationExpr(c.activation, v)
          }); } }`,
      );
    }
  }
  return lines.join("\n  ");
}

function fmaBlock(c: MatmulConfig, aName: (i: number) => string, bName: (j: number) => string) {
  const lines: string[] = [];
  for (let i = 0; i < c.tm; i++) {
    for (let j = 0; j < c.tn; j++) {
      lines.push(`acc[${i * c.tn + j}] = fma(${aName(i)}, ${bName(j)}, acc[${i * c.tn + j}]);`);
    }
  }
  return lines.join("\n    ");
}

function registerWgsl(c: MatmulConfig): string {
  const { tm, tn, wgx, wgy } = c;
  const range = (n: number) => Array.from({ length: n }, (_, i) => i);
  // "register": a thread owns a contiguous TM×TN block. "interleaved": its rows
  // and columns are strided by the workgroup extent, so neighbouring threads
  // (SIMD lanes on a CPU adapter) read neighbouring addresses.
  const interleaved = c.variant === "interleaved";
  const row = (i: number) => interleaved ? `row0 + ${i * wgy}u` : `row0 + ${i}u`;
  const col = (j: number) => interleaved ? `col0 + ${j * wgx}u` : `col0 + ${j}u`;
  const firstRow = interleaved ? `wid.y * ${tm * wgy}u + lid.y` : `gid.y * ${tm}u`;
  const firstCol = interleaved ? `wid.x * ${tn * wgx}u + lid.x` : `gid.x * ${tn}u`;
  // Edge threads clamp their load indices into range and skip out-of-range
  // stores, so the inner loop has no branches.
  const aOffsets = range(tm).map((i) =>
    `let ao${i} = a_base + min(${row(i)}, p.m - 1u) * p.a_row;`
  );
  const bOffsets = range(tn).map((j) =>
    `let bo${j} = b_base + min(${col(j)}, p.n - 1u) * p.b_col;`
  );
  const aLoads = range(tm).map((i) => `let a${i} = f32(a[ao${i} + k * p.a_col]);`);
  const bLoads = range(tn).map((j) => `let b${j} = f32(b[bo${j} + k * p.b_row]);`);
  return `${WGSL_MATH}
@compute @workgroup_size(${wgx}, ${wgy})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let row0 = ${firstRow};
  let col0 = ${firstCol};
  if (row0 >= p.m || col0 >= p.n) { return; }
  let a_base = gid.z * p.a_batch;
  let b_base = gid.z * p.b_batch;
  let c_base = gid.z * p.c_batch;
  ${aOffsets.join("\n  ")}
  ${bOffsets.join("\n  ")}
  var acc: array<f32, ${tm * tn}>;
  for (var k = 0u; k < p.k; k++) {
    ${aLoads.join("\n    ")}
    ${bLoads.join("\n    ")}
    ${fmaBlock(c, (i) => `a${i}`, (j) => `b${j}`)}
  }
  ${epilogue(c, row, col)}
}`;
}

function sharedWgsl(c: MatmulConfig): string {
  const { tm, tn, tk, wgx, wgy } = c;
  const bm = tm * wgy, bn = tn * wgx, threads = wgx * wgy;
  // Each thread's rows and columns are strided by the workgroup extent so
  // neighbouring threads read neighbouring shared-memory words.
  return `${WGSL_MATH}
var<workgroup> tile_a: array<f32, ${bm * tk}>; // [tk][bm]
var<workgroup> tile_b: array<f32, ${tk * bn}>; // [tk][bn]
@compute @workgroup_size(${wgx}, ${wgy})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let tile_row = wid.y * ${bm}u;
  let tile_col = wid.x * ${bn}u;
  let t = lid.y * ${wgx}u + lid.x;
  let a_base = wid.z * p.a_batch;
  let b_base = wid.z * p.b_batch;
  let c_base = wid.z * p.c_batch;
  var acc: array<f32, ${tm * tn}>;
  for (var k0 = 0u; k0 < p.k; k0 += ${tk}u) {
    for (var e = t; e < ${bm * tk}u; e += ${threads}u) {
      let r = e % ${bm}u; let kk = e / ${bm}u;
      let row = tile_row + r; let k = k0 + kk;
      var v = 0.0;
      if (row < p.m && k < p.k) { v = f32(a[a_base + row * p.a_row + k * p.a_col]); }
      tile_a[kk * ${bm}u + r] = v;
    }
    for (var e = t; e < ${tk * bn}u; e += ${threads}u) {
      let col_in = e % ${bn}u; let kk = e / ${bn}u;
      let col = tile_col + col_in; let k = k0 + kk;
      var v = 0.0;
      if (col < p.n && k < p.k) { v = f32(b[b_base + k * p.b_row + col * p.b_col]); }
      tile_b[kk * ${bn}u + col_in] = v;
    }
    workgroupBarrier();
    for (var kk = 0u; kk < ${tk}u; kk++) {
      ${
    Array.from({ length: tm }, (_, i) => `let a${i} = tile_a[kk * ${bm}u + lid.y + ${i * wgy}u];`)
      .join("\n      ")
  }
      ${
    Array.from({ length: tn }, (_, j) => `let b${j} = tile_b[kk * ${bn}u + lid.x + ${j * wgx}u];`)
      .join("\n      ")
  }
      ${fmaBlock(c, (i) => `a${i}`, (j) => `b${j}`)}
    }
    workgroupBarrier();
  }
  ${epilogue(c, (i) => `tile_row + lid.y + ${i * wgy}u`, (j) => `tile_col + lid.x + ${j * wgx}u`)}
}`;
}

/** The matmul kernel family. */
export const matmulKernel = defineKernel({
  name: "matmul",
  bindings: (c: MatmulConfig) => [
    { name: "a", type: c.dtype },
    { name: "b", type: c.dtype },
    { name: "c", type: c.out, write: true },
    ...optional(c.bias !== "none", { name: "bias", type: c.bias as DType }),
  ],
  uniforms: UNIFORMS,
  source: (c) => (c.variant === "shared" ? sharedWgsl(c) : registerWgsl(c)),
});

/**
 * Records C = A·B for a resolved problem into `c` (contiguous [batch, m, n]).
 * `tiling` overrides the tiling tuned for the problem's class (the tuner uses it).
 */
export function dispatchMatmul(
  problem: MatmulProblem,
  a: Tensor,
  b: Tensor,
  c: Tensor,
  epilogue: { bias?: Tensor; activation?: Activation } = {},
  tiling: MatmulTiling = tilingFor(a.gpu, problem, a.dtype),
): void {
  const { batch, m, n, k } = problem;
  if (batch * m * n === 0) return;
  const gpu = a.gpu;
  const config: MatmulConfig = {
    ...tiling,
    dtype: a.dtype,
    out: c.dtype,
    bias: epilogue.bias?.dtype ?? "none",
    activation: epilogue.activation ?? "none",
  };
  const kernel = gpu.kernel(matmulKernel, config);
  const rowsPerGroup = tiling.tm * tiling.wgy, colsPerGroup = tiling.tn * tiling.wgx;
  const { a: la, b: lb } = problem;
  gpu.dispatch(
    kernel,
    { a, b, c, ...(epilogue.bias && { bias: epilogue.bias }) },
    {
      m,
      n,
      k,
      a_batch: la.batch,
      a_row: la.row,
      a_col: la.col,
      b_batch: lb.batch,
      b_row: lb.row,
      b_col: lb.col,
      c_batch: m * n,
    },
    [Math.ceil(n / colsPerGroup), Math.ceil(m / rowsPerGroup), batch],
    { flops: 2 * batch * m * n * k },
  );
}
