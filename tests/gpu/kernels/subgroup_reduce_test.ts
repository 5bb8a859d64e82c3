/**
 * Subgroup reductions (gpu/kernels/wgsl/subgroups.ts) against the workgroup-memory
 * kernels they replace on GPUs, both run on lavapipe as a GPU: row
 * reductions (sum, max with NaN, softmax, log-softmax, LayerNorm,
 * cross-entropy, causal softmax, forward and backward), the gradient norm
 * and the scaler's inf/NaN check, against f64 and each other, f32 and f16.
 */
import assert from "node:assert/strict";
import {
  causalSoftmax,
  logSoftmax,
  max,
  noGrad,
  softmax,
  sum,
  Tensor,
  tidy,
} from "../../../gpu/mod.ts";
import { layerNorm } from "../../../gpu/mod.ts";
import { crossEntropy } from "../../../nn/mod.ts";
import { clipGradNorm } from "../../../optim/mod.ts";
import { launchUnscaleInto } from "../../helpers/internals.ts";
import { gpuLikeProfile, withAdapterProfile } from "../../helpers/internals.ts";
import { dispatchedKernels, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import {
  crossEntropy64,
  quantize,
  reduceMax64,
  reduceSum64,
  softmax64,
  uniform,
} from "../../helpers/reference.ts";
import { assertClose, TOL, type Tolerance } from "../../helpers/assert.ts";

const NO_SUBGROUPS = !gpu.subgroups;
const IGNORE = { ...GPU_TEST, ignore: NO_SUBGROUPS };

/** `fn` run as a GPU with subgroups, then without: both results. */
async function bothPaths<T>(fn: () => Promise<T>): Promise<{ subgroups: T; fallback: T }> {
  const run = (subgroups: boolean) =>
    withAdapterProfile(gpu, { ...gpuLikeProfile(gpu), subgroups }, fn);
  return { subgroups: await run(true), fallback: await run(false) };
}

// Sums of up to 4097 values of |v| <= 3 in another order: f32 roundings of the sum of |v|.
const ROW_TOL: Record<"f32" | "f16", Tolerance> = {
  f32: { atol: 2e-4, rtol: 1e-4 },
  f16: TOL.f16,
};

Deno.test({
  name: `subgroup row reductions match f64 and the fallback, f32 and f16, odd shapes${
    NO_SUBGROUPS ? " (ignored: no subgroups on this device)" : ""
  }`,
  ...IGNORE,
  async fn() {
    for (const [rows, cols] of [[1, 65], [7, 385], [65, 4097], [383, 129]]) {
      for (const dtype of ["f32", "f16"] as const) {
        const n = rows * cols, label = `${dtype} [${rows}, ${cols}]`;
        const x = quantize(uniform(n, n + 1, -3, 3), dtype);
        if (n > 100) x[100] = NaN; // max lets NaN win in both paths
        const view = { outer: rows, axis: cols, inner: 1 };
        const { subgroups, fallback } = await bothPaths(async () => {
          const t = Tensor.from(x, [rows, cols], { dtype });
          const keys = dispatchedKernels(() => tidy(() => void sum(t, { axis: -1 })));
          const out = await tidy(() => ({
            sum: sum(t, { axis: -1 }).read(),
            max: noGrad(() => max(t, { axis: -1 })).read(),
            softmax: softmax(t).read(),
            log: logSoftmax(t).read(),
          }));
          t.dispose();
          return {
            keys,
            sum: await out.sum,
            max: await out.max,
            softmax: await out.softmax,
            log: await out.log,
          };
        });
        assert.ok(subgroups.keys.some((k) => k.includes("layout=subgroup")), label);
        assert.ok(fallback.keys.every((k) => !k.includes("layout=subgroup")), label);
        const finite = (a: ArrayLike<number>) => Array.from(a, (v) => (Number.isNaN(v) ? 0 : v));
        for (const path of [subgroups, fallback]) {
          assertClose(
            finite(path.sum),
            finite(reduceSum64(x, view)),
            ROW_TOL[dtype],
            `sum ${label}`,
          );
          assert.deepEqual(path.max, fallback.max, `max ${label}: identical, NaN included`);
          assertClose(finite(path.max), finite(reduceMax64(x, view)), TOL[dtype], `max ${label}`);
          const clean = n > 100 ? 100 / cols | 0 : -1; // the NaN's row is NaN throughout
          const pick = (a: ArrayLike<number>) =>
            Array.from(a).filter((_, i) => (i / cols | 0) !== clean);
          assertClose(
            pick(path.softmax),
            pick(softmax64(x, cols, false)),
            TOL[dtype],
            `softmax ${label}`,
          );
          assertClose(
            pick(path.log),
            pick(softmax64(x, cols, true)),
            ROW_TOL[dtype],
            `log ${label}`,
          );
        }
      }
    }
  },
});

Deno.test({
  name:
    `subgroup LayerNorm, cross-entropy and causal softmax (forward and backward) match the fallback${
      NO_SUBGROUPS ? " (ignored: no subgroups on this device)" : ""
    }`,
  ...IGNORE,
  async fn() {
    for (const [rows, cols] of [[3, 65], [65, 385], [7, 4097]]) {
      for (const dtype of ["f32", "f16"] as const) {
        const n = rows * cols, label = `${dtype} [${rows}, ${cols}]`;
        const x = quantize(uniform(n, n + 2, -2, 3), dtype);
        const g = quantize(uniform(n, n + 3), dtype);
        const targets = Array.from({ length: rows }, (_, r) => (r * 31) % cols);
        const { subgroups, fallback } = await bothPaths(async () => {
          const t = Tensor.from(x, [rows, cols], { dtype, requiresGrad: true });
          const y = layerNorm(t);
          y.backward({ gradient: Tensor.from(g, [rows, cols], { dtype }) });
          const ln = [await y.read(), await t.grad!.read()];
          t.grad!.dispose();
          t.grad = null;
          const loss = crossEntropy(t, targets, { reduction: "sum" });
          loss.backward();
          const ce = [await loss.read(), await t.grad!.read()];
          t.grad!.dispose();
          const side = Math.min(cols, 129); // past the GPU's thread-per-row 64: a workgroup per row
          const square = Tensor.from(uniform(side * side, 5), [side, side], {
            dtype,
            requiresGrad: true,
          });
          const p = causalSoftmax(square, { scale: 0.5 });
          p.backward({ gradient: Tensor.from(uniform(side * side, 6), [side, side], { dtype }) });
          const causal = [await p.read(), await square.grad!.read()];
          for (const d of [t, y, loss, square, p, square.grad!]) d.dispose();
          return { ln, ce, causal };
        });
        const tol = ROW_TOL[dtype];
        for (const part of ["ln", "ce", "causal"] as const) {
          for (const i of [0, 1]) {
            assertClose(subgroups[part][i], fallback[part][i], tol, `${part}[${i}] ${label}`);
          }
        }
        const ref = crossEntropy64(x, targets, cols, {
          smoothing: 0,
          weight: null,
          reduction: "sum",
        });
        assertClose(subgroups.ce[0], [ref.loss.reduce((a, b) => a + b, 0)], {
          atol: 1e-3,
          rtol: 1e-4,
        }, label);
        assertClose(subgroups.ce[1], ref.grad, tol, `cross-entropy gradient ${label}`);
      }
    }
  },
});

Deno.test({
  name:
    `subgroup gradient norm matches f64 and the fallback; the scaler's skip decision is the same${
      NO_SUBGROUPS ? " (ignored: no subgroups on this device)" : ""
    }`,
  ...IGNORE,
  async fn() {
    const sizes = [1, 63, 4097, 300001];
    for (const dtype of ["f32", "f16"] as const) {
      const values = sizes.map((n, i) => quantize(uniform(n, 40 + i), dtype));
      const norm64 = Math.sqrt(values.reduce((a, v) => a + v.reduce((s, x) => s + x * x, 0), 0));
      const { subgroups, fallback } = await bothPaths(async () => {
        const params = values.map((v) => {
          const p = Tensor.from(v, [v.length], { dtype, requiresGrad: true });
          p.grad = Tensor.from(v, [v.length], { dtype });
          return p;
        });
        const { totalNorm, coefficient } = clipGradNorm(params, 1);
        const norm = await totalNorm.item();
        // The scaler's check: clean, then with one Inf, then one NaN in the last gradient.
        const found = [];
        for (const bad of [null, Infinity, NaN]) {
          const grads = params.map((p) => p.grad!);
          if (bad !== null) {
            grads[3].dispose();
            const v = Float64Array.from(values[3]);
            v[4096] = bad;
            grads[3] = params[3].grad = Tensor.from(v, [v.length], { dtype });
          }
          const flag = Tensor.full([1], 0), scale = Tensor.full([1], 2);
          launchUnscaleInto(grads, scale, flag);
          found.push(await flag.item());
          flag.dispose();
          scale.dispose();
        }
        for (const p of params) p.grad!.dispose(), p.dispose();
        totalNorm.dispose();
        coefficient.dispose();
        return { norm, found };
      });
      // f32 squares summed in blocks: relative error well under 1e-5 at these sizes.
      assertClose([subgroups.norm], [norm64], { atol: 0, rtol: 1e-5 }, `norm ${dtype}`);
      assertClose([subgroups.norm], [fallback.norm], { atol: 0, rtol: 1e-5 }, `norm ${dtype}`);
      assert.deepEqual(subgroups.found, [0, 1, 1], dtype);
      assert.deepEqual(fallback.found, subgroups.found, dtype);
    }
  },
});
