/**
 * The row kernels (LayerNorm, softmax, log-softmax, cross-entropy; forward
 * and backward) at values near f16's and bf16's limits, on every row path,
 * against the f64 references rounded to the output's dtype (where the true
 * result passes the dtype's range, ±∞, as PyTorch's correctly rounded
 * result is). Each tensor holds three kinds of row, by row index mod 3:
 *
 * - **huge**: every value of magnitude up to f16's largest (65504) in f16;
 *   in bf16 up to 2.9e17 for LayerNorm (so that a row's Σ(x − μ)² over 4097
 *   entries stays inside f32: PyTorch's f32 statistics overflow past it too)
 *   up to 3e38, near bf16's largest, for the softmaxes, and up to 4e34 for
 *   cross-entropy (so that label smoothing's Σ_c (lse − x_c) over 4097
 *   classes stays inside f32: PyTorch's is ∞ past it). Guards: statistics and sums in f32, not in a narrower
 *   accumulator (x² and row sums overflow f16 at these values); the max
 *   subtraction before exp (x − max spans 2·65504, or overflows to −∞ in
 *   bf16: exp gives exactly 0, log-softmax −∞, as in PyTorch);
 * - **tiny**: f16 subnormals (below 2⁻¹⁴ ≈ 6.1e-5), and 1e-30 in bf16 (a
 *   bf16 below f32's smallest normal would be an f32 subnormal, which WGSL
 *   lets a GPU flush, so none is used). Guards: subnormal f16 is read
 *   exactly, not flushed to 0 (LayerNorm scales these rows by 1/√eps ≈ 316:
 *   a flushed row gives y = bias);
 * - **outlier**: values in ±2 with one at the dtype's huge value. Guards:
 *   the two-pass variance (a one-pass E[x²] − E[x]² loses the small values);
 *   the row maximum found across threads and lanes wherever it lies (an
 *   outlier in a lane whose partial is skipped makes exp overflow to ∞).
 *
 * Each row is compared at its own scale (assertCloseScaled): LayerNorm's dx
 * is ~1e-17 on huge bf16 rows and ~1 elsewhere. Shapes and configs are
 * row_kernels_test.ts's (odd, long odd, vec4 rows), so a full run compiles
 * nothing new.
 */
import { DTYPES, logSoftmax, softmax, Tensor } from "../../../gpu/mod.ts";
import { layerNorm } from "../../../gpu/ops/layer_norm.ts";
import { crossEntropyPerRow } from "../../../gpu/ops/cross_entropy.ts";
import { dispatchedKernelsAsync, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { assertPathKeys, ROW_PATHS } from "../../helpers/row_paths.ts";
import {
  crossEntropy64,
  layerNorm64,
  quantize,
  softmax64,
  softmaxBackward64,
  uniform,
} from "../../helpers/reference.ts";
import { assertCloseScaled, TOL, type Tolerance } from "../../helpers/assert.ts";

/** [rows, cols]: odd rows, long odd rows (4097: 64 lanes of a GPU path), vec4 rows. */
const SHAPES = [[70, 65], [3, 4097], [33, 384]];

const HALVES = DTYPES.filter((d): d is "f16" | "bf16" => d !== "f32" && (d !== "f16" || gpu.f16));

/** The largest magnitude of a huge row, per dtype and op family (see the file's comment). */
const HUGE: Record<"layerNorm" | "softmax" | "crossEntropy", Record<"f16" | "bf16", number>> = {
  layerNorm: { f16: 65504, bf16: 2.9e17 },
  softmax: { f16: 65504, bf16: 3e38 },
  crossEntropy: { f16: 65504, bf16: 4e34 },
};

/** Tiny rows: f16 subnormals, bf16 values far below f16's range but normal in f32. */
const TINY: Record<"f16" | "bf16", number> = { f16: 6e-5, bf16: 1e-30 };

// Statistics in f32 over up to 4097 terms, then the result stored in the dtype.
const STAT_TOL: Tolerance = { atol: 2e-4, rtol: 1e-4 };

/** Rows of the three kinds (huge, tiny, outlier by row index mod 3), stored in `dtype`. */
function extremeRows(
  rows: number,
  cols: number,
  dtype: "f16" | "bf16",
  family: keyof typeof HUGE,
  seed: number,
): Float64Array {
  const huge = HUGE[family][dtype], x = uniform(rows * cols, seed, -1, 1);
  for (let r = 0; r < rows; r++) {
    const row = x.subarray(r * cols, (r + 1) * cols);
    if (r % 3 === 0) row.forEach((v, j) => row[j] = v * huge);
    if (r % 3 === 1) row.forEach((v, j) => row[j] = v * TINY[dtype]);
    if (r % 3 === 2) {
      row.forEach((v, j) => row[j] = 2 * v);
      row[(r * 7) % cols] = huge; // a different lane in each row
    }
  }
  return quantize(x, dtype);
}

/**
 * Asserts row by row that `actual` matches `expected` rounded to `dtype`:
 * with `scale`, absolute atol·scale (the softmaxes' results are O(1) or
 * exact up to their magnitude: |log p| of −6e38 is compared by rtol);
 * without, each row at its largest value (LayerNorm's dx is ~1e-17 on
 * huge bf16 rows and ~1 on others).
 */
function assertRows(
  actual: ArrayLike<number>,
  expected: Float64Array,
  cols: number,
  dtype: "f32" | "f16" | "bf16",
  tol: Tolerance,
  what: string,
  scale?: number,
): void {
  const rounded = quantize(expected, dtype);
  for (let r = 0; r < expected.length / cols; r++) {
    const cut = (x: ArrayLike<number>) => Array.prototype.slice.call(x, r * cols, (r + 1) * cols);
    const kind = ["huge", "tiny", "outlier"][r % 3];
    assertCloseScaled(cut(actual), cut(rounded), tol, `${what} row ${r} (${kind})`, { scale });
  }
}

/** Runs `check` on every path, shape and half dtype, and checks the path's kernels ran. */
async function onEveryPath(
  kernel: string,
  check: (rows: number, cols: number, dtype: "f16" | "bf16", label: string) => Promise<void>,
): Promise<void> {
  for (const path of ROW_PATHS) {
    const keys = await dispatchedKernelsAsync(() =>
      path.run(async () => {
        for (const [rows, cols] of SHAPES) {
          for (const dtype of HALVES) {
            await check(rows, cols, dtype, `${path.name} ${dtype} [${rows}, ${cols}]`);
          }
        }
      })
    );
    assertPathKeys(path, keys.filter((k) => k.startsWith(kernel)), [64]);
  }
}

Deno.test({
  name: "row kernels at f16's and bf16's limits: LayerNorm forward and backward on huge, " +
    "subnormal and outlier rows match f64 on every row path",
  ...GPU_TEST,
  async fn() {
    await onEveryPath("layer_norm_", async (rows, cols, dtype, label) => {
      const x = extremeRows(rows, cols, dtype, "layerNorm", cols);
      const g = quantize(uniform(rows * cols, 11), dtype);
      const w = quantize(uniform(cols, 5, 0.5, 1.5), "f32");
      const b = quantize(uniform(cols, 6, -1, 1), "f32");
      const tx = Tensor.from(x, [rows, cols], { dtype, requiresGrad: true });
      const tw = Tensor.from(w, [cols], { requiresGrad: true });
      const tb = Tensor.from(b, [cols], { requiresGrad: true });
      const ref = layerNorm64(x, g, cols, w, b, 1e-5);
      const y = layerNorm(tx, { weight: tw, bias: tb });
      // y is bias + x̂·w: compared at the row's |x̂| scale, not the bias's.
      assertRows(await y.read(), ref.y, cols, dtype, TOL[dtype], `y ${label}`);
      y.backward({ gradient: Tensor.from(g, [rows, cols], { dtype }) });
      assertRows(await tx.grad!.read(), ref.dx, cols, dtype, TOL[dtype], `dx ${label}`);
      assertCloseScaled(await tw.grad!.read(), ref.dw, STAT_TOL, `dweight ${label}`);
      assertCloseScaled(await tb.grad!.read(), ref.db, STAT_TOL, `dbias ${label}`);
      for (const t of [tx, tw, tb]) t.grad!.dispose();
      for (const t of [tx, tw, tb, y]) t.dispose();
    });
  },
});

Deno.test({
  name: "row kernels at f16's and bf16's limits: softmax and log-softmax forward and backward " +
    "on huge, subnormal and outlier rows match f64 on every row path",
  ...GPU_TEST,
  async fn() {
    await onEveryPath("softmax_", async (rows, cols, dtype, label) => {
      const x = extremeRows(rows, cols, dtype, "softmax", cols + 1);
      const g = quantize(uniform(rows * cols, 2), dtype);
      for (const log of [false, true]) {
        const what = `${log ? "log_softmax" : "softmax"} ${label}`;
        const tx = Tensor.from(x, [rows, cols], { dtype, requiresGrad: true });
        const y = (log ? logSoftmax : softmax)(tx);
        const ref = softmax64(x, cols, log);
        assertRows(await y.read(), ref, cols, dtype, TOL[dtype], what, 1);
        y.backward({ gradient: Tensor.from(g, [rows, cols], { dtype }) });
        const dx = softmaxBackward64(ref, g, cols, log);
        assertRows(await tx.grad!.read(), dx, cols, dtype, TOL[dtype], `${what} grad`, 1);
        for (const t of [tx.grad!, tx, y]) t.dispose();
      }
    });
  },
});

Deno.test({
  name: "row kernels at f16's and bf16's limits: cross-entropy (smoothing, an ignored row) " +
    "forward and backward on huge, subnormal and outlier logits match f64 on every row path",
  ...GPU_TEST,
  async fn() {
    await onEveryPath("cross_entropy_forward", async (rows, cols, dtype, label) => {
      const x = extremeRows(rows, cols, dtype, "crossEntropy", cols + 3);
      // Targets on the outlier itself in some rows, elsewhere in others.
      const targets = Array.from(
        { length: rows },
        (_, r) => r % 2 ? (r * 7) % cols : (r * 5) % cols,
      );
      if (rows > 1) targets[1] = -100;
      const g = quantize(uniform(rows, 9, 0.5, 1.5), "f32");
      const tx = Tensor.from(x, [rows, cols], { dtype, requiresGrad: true });
      const ids = Tensor.from(targets, [rows], { dtype: "i32" });
      const { losses, targetWeights } = crossEntropyPerRow(tx, ids, { smoothing: 0.1 });
      const ref = crossEntropy64(x, targets, cols, {
        smoothing: 0.1,
        weight: null,
        reduction: "none",
      });
      // Losses reach 2·3e38 on huge bf16 rows: ∞ in f32, as in PyTorch.
      assertRows(
        await losses.read(),
        Float64Array.from(ref.loss),
        1,
        "f32",
        STAT_TOL,
        `loss ${label}`,
      );
      losses.backward({ gradient: Tensor.from(g, [rows]) });
      const dx = ref.grad.map((v, i) => v * g[Math.floor(i / cols)]);
      assertRows(await tx.grad!.read(), dx, cols, dtype, TOL[dtype], `dx ${label}`, 1);
      for (const t of [tx.grad!, tx, ids, losses, targetWeights]) t.dispose();
    });
  },
});
