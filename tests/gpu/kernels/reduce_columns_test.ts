/**
 * Column reductions in two coalesced stages (gpu/kernels/rows/reduce_columns.ts,
 * layer_norm_columns.ts), the GPU path of bias and LayerNorm parameter
 * gradients, forced on lavapipe: against f64 at odd shapes, f32 and f16,
 * bit-identical from run to run, and taken where the adapter profile says.
 */
import assert from "node:assert/strict";
import { linear, Tensor, tidy } from "../../../gpu/mod.ts";
import { launchColumnSumInto } from "../../../gpu/kernels/rows/reduce_columns.ts";
import { launchLayerNormColumnGradsInto } from "../../../gpu/kernels/rows/layer_norm_columns.ts";
import {
  launchLayerNorm,
  launchLayerNormParamGrads,
} from "../../../gpu/kernels/rows/layer_norm.ts";
import { launchReduce } from "../../../gpu/kernels/reduce.ts";
import { asGpu, dispatchedKernels, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { quantize, reduceSum64, uniform } from "../../helpers/reference.ts";
import { assertClose, type Tolerance } from "../../helpers/assert.ts";

const ROWS = [1, 65, 383, 4097];
const COLS = [1, 7, 384, 385];

// f32 sums of up to 4097 terms of |v| <= 3 in blocks (at most 16 per lane, 4 lanes,
// ~65 partials): the error stays under ~100 roundings of the sum of |terms| (~1e-5·rows).
const SUM_TOL: Tolerance = { atol: 2e-4, rtol: 1e-5 };
// An f16 result is the f32 sum rounded to f16 (half an ulp: 4.9e-4 relative).
const F16_OUT_TOL: Tolerance = { atol: 1e-3, rtol: 1e-3 };
// A bf16 result: half an ulp is 3.9e-3 relative.
const BF16_OUT_TOL: Tolerance = { atol: 8e-3, rtol: 8e-3 };

Deno.test({
  name: "column sum: two stages match f64 at odd shapes, f32, f16 and bf16 in and out, outer > 1",
  ...GPU_TEST,
  async fn() {
    for (const rows of ROWS) {
      for (const cols of COLS) {
        for (const dtype of ["f32", "f16", "bf16"] as const) {
          const outer = rows * cols < 4096 ? 3 : 1;
          const n = outer * rows * cols, label = `${dtype} [${outer}, ${rows}, ${cols}]`;
          const x = quantize(uniform(n, rows + cols, -1, 1), dtype);
          const ref = reduceSum64(x, { outer, axis: rows, inner: cols }, 0.5);
          const src = Tensor.from(x, [n], { dtype });
          for (const out of dtype === "f32" ? ["f32"] as const : ["f32", dtype] as const) {
            const dst = Tensor.empty([outer * cols], out);
            launchColumnSumInto(src, { outer, rows, cols }, dst, 0.5);
            const tol = out === "f16" ? F16_OUT_TOL : out === "bf16" ? BF16_OUT_TOL : SUM_TOL;
            assertClose(await dst.read(), ref, tol, `${label} -> ${out}`);
            dst.dispose();
          }
          src.dispose();
        }
      }
    }
  },
});

/** f64 Σ_rows g·x̂ and Σ_rows g of a LayerNorm (eps 1e-5). */
function paramGrads64(x: Float64Array, g: Float64Array, rows: number, cols: number) {
  const dw = new Float64Array(cols), db = new Float64Array(cols);
  for (let r = 0; r < rows; r++) {
    const row = x.subarray(r * cols, (r + 1) * cols);
    const mu = row.reduce((a, v) => a + v, 0) / cols;
    const rstd = 1 / Math.sqrt(row.reduce((a, v) => a + (v - mu) ** 2, 0) / cols + 1e-5);
    for (let j = 0; j < cols; j++) {
      dw[j] += g[r * cols + j] * (row[j] - mu) * rstd;
      db[j] += g[r * cols + j];
    }
  }
  return { dw, db };
}

Deno.test({
  name: "LayerNorm parameter gradients in two stages match f64 at odd shapes, f32 and f16",
  ...GPU_TEST,
  async fn() {
    for (const rows of ROWS) {
      for (const cols of COLS) {
        for (const dtype of ["f32", "f16"] as const) {
          const n = rows * cols, label = `${dtype} [${rows}, ${cols}]`;
          const x = quantize(uniform(n, n + 3, -2, 3), dtype);
          const g = quantize(uniform(n, n + 4), dtype);
          const tx = Tensor.from(x, [rows, cols], { dtype });
          const tg = Tensor.from(g, [rows, cols], { dtype });
          const { y, mean, rstd } = launchLayerNorm(tx, null, null, 1e-5);
          const dw = Tensor.empty([cols], "f32"), db = Tensor.empty([cols], "f32");
          launchLayerNormColumnGradsInto(tx, tg, { mean, rstd }, { rows, cols }, { dw, db });
          const ref = paramGrads64(x, g, rows, cols);
          // x̂ uses the f32 statistics; terms up to ~3 in size (SUM_TOL's bound).
          assertClose(await dw.read(), ref.dw, SUM_TOL, `dweight ${label}`);
          assertClose(await db.read(), ref.db, SUM_TOL, `dbias ${label}`);
          // Only one of them wanted.
          const only = Tensor.empty([cols], "f32");
          launchLayerNormColumnGradsInto(tx, tg, { mean, rstd }, { rows, cols }, {
            dw: null,
            db: only,
          });
          assert.deepEqual(await only.read(), await db.read(), label);
          for (const t of [tx, tg, y, mean, rstd, dw, db, only]) t.dispose();
        }
      }
    }
  },
});

Deno.test({
  name: "column sums repeat bit for bit; on GPUs bias and LayerNorm gradients take them",
  ...GPU_TEST,
  async fn() {
    const [rows, cols] = [4097, 385];
    const x = Tensor.from(uniform(rows * cols, 9, -1e3, 1e3), [rows, cols]);
    const runs = [];
    for (let i = 0; i < 3; i++) {
      const dst = Tensor.empty([cols], "f32");
      launchColumnSumInto(x, { outer: 1, rows, cols }, dst);
      runs.push(await dst.read());
      dst.dispose();
    }
    assert.deepEqual(runs[1], runs[0]);
    assert.deepEqual(runs[2], runs[0]);
    const view = { outer: 1, axis: rows, inner: cols };
    const kernelsOf = () =>
      dispatchedKernels(() => tidy(() => void launchReduce("sum", x, view, [cols])));
    // lavapipe keeps today's kernel; a GPU takes the two stages, with the same sums.
    if (gpu.adapterProfile.cpu) assert.ok(kernelsOf().every((k) => k.startsWith("reduce{")));
    const cpuSums = await tidy(() => launchReduce("sum", x, view, [cols])).read();
    await asGpu(async () => {
      assert.deepEqual(kernelsOf().map((k) => k.split("{")[0]), ["column_sum", "column_sum"]);
      assertClose(await tidy(() => launchReduce("sum", x, view, [cols])).read(), cpuSums, {
        atol: 1e-1, // sums up to ~1e5 of terms up to 1e3: f32 roundings in another order
        rtol: 1e-5,
      });
      // A bias gradient of 64 features over 4097 rows takes them; of 3, not (too narrow).
      for (const features of [64, 3]) {
        const w = Tensor.from(uniform(cols * features, 2), [features, cols]);
        const b = Tensor.from(uniform(features, 3), [features], { requiresGrad: true });
        const gradient = Tensor.full([rows, features], 1);
        const biasKernels = dispatchedKernels(() =>
          tidy(() => linear(x, w, { bias: b }).backward({ gradient }))
        );
        const used = biasKernels.filter((k) => k.startsWith("column_sum")).length;
        assert.equal(used, features === 64 ? 2 : 0, `${features} features`);
        // Σ of ones over 4097 rows, exactly.
        assert.deepEqual([...await b.grad!.read()], new Array(features).fill(rows));
        for (const t of [w, b, b.grad!, gradient]) t.dispose();
      }
      const g = Tensor.full([rows, cols], 1);
      const ln = launchLayerNorm(x, null, null, 1e-5);
      const lnKernels = dispatchedKernels(() =>
        tidy(() => {
          launchLayerNormParamGrads(x, g, ln.mean, ln.rstd, { weight: true, bias: true });
        })
      );
      assert.deepEqual(lnKernels.map((k) => k.split("{")[0]), [
        "layer_norm_column_partials",
        "column_sum",
        "column_sum",
      ]);
      for (const t of [g, ln.y, ln.mean, ln.rstd]) t.dispose();
    });
    x.dispose();
  },
});
