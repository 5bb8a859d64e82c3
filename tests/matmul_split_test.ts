import assert from "node:assert/strict";
import {
  backward,
  DTYPES,
  type FloatDType,
  linear,
  matmul,
  type MatmulTiling,
  Tensor,
  tidy,
} from "../gpu/mod.ts";
import { gemmSlices, sliceLength } from "../gpu/kernels/gemm/gemm.ts";
import { dispatchedKernels, gpu, GPU_TEST, withSettings } from "./_gpu.ts";
import { matmulSettings } from "../gpu/kernels/gemm/settings.ts";
import { matmul64, quantize, uniform } from "./_reference.ts";
import { assertClose, TOL, type Tolerance } from "./_assert.ts";

/** As matmul_test: error may grow like √K times the unit roundoff. */
function tolFor(dtype: FloatDType, k: number): Tolerance {
  const t = TOL[dtype];
  return { atol: t.atol * Math.max(1, Math.sqrt(k) / 4), rtol: t.rtol };
}

/** Runs `fn` with split-K aiming at `workgroups` workgroups, then restores the setting. */
function withSplitTarget<T>(workgroups: number, fn: () => Promise<T>): Promise<T> {
  return withSettings(matmulSettings.of(gpu), { splitKWorkgroups: workgroups }, fn);
}

const BLOCKED_128: MatmulTiling = { variant: "blocked", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 8 };

Deno.test({
  name: "split-K: how many slices a reduction gets (the GPT's weight gradients on a GPU tiling)",
  ...GPU_TEST,
  async fn() {
    await withSplitTarget(256, () => {
      // fc1 gᵀ·x at the real GPT size: 1536×384 in 128×128 tiles is 36 workgroups, K = 16384.
      assert.deepEqual(sliceLength(16384, gemmSlices(gpu, BLOCKED_128, 36, 16384), BLOCKED_128), {
        length: 2048,
        slices: 8,
      });
      // The attention projection's 384×384: 9 tiles want 29 slices; each a multiple of TK.
      const proj = sliceLength(16384, gemmSlices(gpu, BLOCKED_128, 9, 16384), BLOCKED_128);
      assert.equal(proj.slices, 29);
      assert.equal(proj.length % BLOCKED_128.tk, 0);
      assert.ok(proj.length * proj.slices >= 16384 && proj.length * (proj.slices - 1) < 16384);
      // Enough tiles already, a short reduction, or a slice cap of 64.
      assert.equal(gemmSlices(gpu, BLOCKED_128, 256, 1 << 18), 1);
      assert.equal(gemmSlices(gpu, BLOCKED_128, 1, 511), 1);
      assert.equal(gemmSlices(gpu, BLOCKED_128, 1, 1 << 20), 64);
      return Promise.resolve();
    });
    await withSplitTarget(0, () => {
      assert.equal(gemmSlices(gpu, BLOCKED_128, 1, 16384), 1);
      return Promise.resolve();
    });
  },
});

Deno.test({
  name: "split-K: a long reduction over few tiles is split and still matches f64, " +
    "every orientation, f32, f16 and bf16, batched, the same bits every run",
  ...GPU_TEST,
  async fn() {
    const shapes = [
      { batch: 1, m: 33, n: 17, k: 2500 },
      { batch: 2, m: 5, n: 9, k: 1031 },
    ];
    // The slices' f32 partial sums are rounded once, into C's dtype (bf16 needs no shader-f16).
    for (const dtype of DTYPES.filter((d) => d !== "f16" || gpu.f16)) {
      for (const [s, dims] of shapes.entries()) {
        for (const [transA, transB] of [[false, true], [false, false], [true, false]]) {
          const { batch, m, n, k } = dims;
          const a = quantize(uniform(batch * m * k, 3 * s + 1), dtype);
          const b = quantize(uniform(batch * k * n, 3 * s + 2), dtype);
          const batched = (shape: number[]) => (batch > 1 ? [batch, ...shape] : shape);
          const ta = Tensor.from(a, batched(transA ? [k, m] : [m, k]), { dtype });
          const tb = Tensor.from(b, batched(transB ? [n, k] : [k, n]), { dtype });
          const expected = matmul64(a, b, { ...dims, transA, transB });
          const label = `${dtype} ${JSON.stringify({ ...dims, transA, transB })}`;
          const run = async (workgroups: number) =>
            await withSplitTarget(workgroups, async () => {
              let c: Tensor | undefined;
              const kernels = dispatchedKernels(() => c = matmul(ta, tb, { transA, transB }));
              const values = await c!.read();
              c!.dispose();
              return { values, kernels };
            });
          const whole = await run(0), split = await run(256);
          // Unsplit: one product. Split: the sliced product, then the sum of its slices.
          assert.equal(whole.kernels.length, 1, `${label}: ${whole.kernels}`);
          assert.equal(split.kernels.length, 2, `${label}: ${split.kernels}`);
          assert.match(split.kernels[1], /^reduce/, label);
          assertClose(whole.values, expected, tolFor(dtype, k), `${label} unsplit`);
          assertClose(split.values, expected, tolFor(dtype, k), `${label} split`);
          // Slices are added in a fixed order: a repeat gives the same bits.
          assert.deepEqual((await run(256)).values, split.values, `${label} repeat`);
          ta.dispose();
          tb.dispose();
        }
      }
    }
  },
});

Deno.test({
  name: "split-K: a linear layer's weight gradient over many rows matches f64; " +
    "products with a bias are not split; partial sums are freed; f32 and bf16",
  ...GPU_TEST,
  async fn() {
    const rows = 1500, inF = 24, outF = 10;
    for (const dtype of ["f32", "bf16"] as const) {
      const x = quantize(uniform(rows * inF, 11), dtype);
      const w = quantize(uniform(outF * inF, 12), dtype);
      const g = quantize(uniform(rows * outF, 13), dtype);
      const before = gpu.memoryStats().allocatedBytes;
      const tx = Tensor.from(x, [rows, inF], { dtype });
      const tw = Tensor.from(w, [outF, inF], { dtype, requiresGrad: true });
      const bias = Tensor.zeros([outF]);
      const forward = dispatchedKernels(() => tidy(() => linear(tx, tw, { bias }).dispose()));
      assert.deepEqual(forward.map((key) => key.split(/[^a-z_0-9]/)[0]), ["matmul"]);
      const y = linear(tx, tw);
      const gradient = Tensor.from(g, [rows, outF], { dtype });
      const kernels = dispatchedKernels(() => backward(y, { gradient }));
      assert.ok(kernels.some((key) => key.startsWith("reduce")), `${dtype}: ${kernels}`);
      // dW = gᵀ·x: K is the rows.
      const dw = new Float64Array(outF * inF);
      for (let r = 0; r < rows; r++) {
        for (let o = 0; o < outF; o++) {
          for (let i = 0; i < inF; i++) dw[o * inF + i] += g[r * outF + o] * x[r * inF + i];
        }
      }
      assertClose(await tw.grad!.read(), dw, tolFor(dtype, rows), `dW ${dtype}`);
      assert.equal(tw.grad!.dtype, dtype);
      [tx, tw, tw.grad!, y, bias, gradient].forEach((t) => t.dispose());
      assert.equal(gpu.memoryStats().allocatedBytes, before, `${dtype}: partial sums released`);
    }
  },
});
