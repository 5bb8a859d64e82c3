import assert from "node:assert/strict";
import {
  backward,
  DTYPES,
  type Gpu,
  linear,
  matmul,
  type MatmulTiling,
  Tensor,
  tidy,
} from "../../../gpu/mod.ts";
import { gemmSlices, sliceLength, waveSlices } from "../../../gpu/kernels/gemm/gemm.ts";
import { dispatchedKernels, gpu, GPU_TEST, withSettings } from "../../helpers/gpu.ts";
import { DEFAULT_TILING, matmulSettings } from "../../../gpu/kernels/gemm/settings.ts";
import { matmul64, quantize, uniform } from "../../helpers/reference.ts";
import { gpuLikeProfile } from "../../helpers/internals.ts";
import { assertClose, tolFor } from "../../helpers/assert.ts";

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

/** 128 × 128 tiles stepping k by 32: the first GPU tiling. */
const VEC4_128: MatmulTiling = { variant: "vec4", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 32 };

/**
 * A device as the slice rules see it: a GPU of `multiprocessors`, stopping
 * an invocation after `loopCap` iterations (lavapipe's 65535 less the
 * margin `Gpu` keeps; Infinity on other adapters), split-K aiming at
 * `target` workgroups.
 */
function device(multiprocessors: number, loopCap = Infinity, target = 256): Gpu {
  const stub = {
    adapterProfile: { ...gpuLikeProfile(gpu), multiprocessors },
    loopIterationLimit: loopCap,
  } as unknown as Gpu;
  matmulSettings.of(stub).splitKWorkgroups = target;
  return stub;
}

Deno.test("split-K: the whole-wave slice counts, against wave fills worked by hand", () => {
  // fc1's weight gradient gᵀ·x: 1536 × 384 in 128 × 128 tiles is 12 × 3 = 36 workgroups over
  // k = 16384 (at most 64 slices). Counts tried: ⌊w·SMs/36⌋ and ⌈w·SMs/36⌉ for 1 to 4 waves w.
  const fc1 = { m: 1536, n: 384, k: 16384 };
  // 132 SMs: 3, 4, 7, 8, 11, 14, 15 slices make 108, 144, 252, 288, 396, 504, 540 workgroups
  // in 1, 2, 2, 3, 3, 4, 5 waves, filling 108/132, 144/264, 252/264, 288/396, 396/396, 504/528,
  // 540/660 of them (.82, .55, .95, .73, 1, .95, .82): fullest first, ties to fewer slices.
  assert.deepEqual(waveSlices(device(132), VEC4_128, fc1, 1, 7), [11, 7, 14, 3, 15, 8, 4]);
  assert.deepEqual(waveSlices(device(132), VEC4_128, fc1, 1), [11, 7], "two by default");
  // 108 SMs: 36 divides 108, so 3, 6, 9 and 12 slices all fill their waves: fewest first.
  assert.deepEqual(waveSlices(device(108), VEC4_128, fc1, 1, 4), [3, 6, 9, 12]);
  // 80 SMs: 2, 3, 4, 5, 6, 7, 8, 9 slices fill 72/80, 108/160, 144/160, 180/240, 216/240,
  // 252/320, 288/320, 324/400: .9 (2, 4, 6, 8), .81, .79, .75, .68.
  assert.deepEqual(waveSlices(device(80), VEC4_128, fc1, 1, 8), [2, 4, 6, 8, 9, 7, 5, 3]);
  // 32 SMs: 36 tiles fill a wave unsplit.
  assert.deepEqual(waveSlices(device(32), VEC4_128, fc1, 1, 8), []);
  // One tile over k = 16384 on 20 SMs: 20, 40, 60, 80 slices wanted (80 capped at 64); 60
  // slices of ⌈16384/60/32⌉·32 = 288 are 57 in fact. 20 and 40 fill, 57/60, 64/80.
  const one = { m: 128, n: 128, k: 16384 };
  assert.deepEqual(waveSlices(device(20), VEC4_128, one, 1, 4), [20, 40, 57, 64]);
  // 3 × 4 tiles over k = 3200 on 132 SMs: 11 slices fill a wave, but slices of
  // ⌈3200/11/32⌉·32 = 320 make 10 (120/132); 22 and more are capped at 3200/256 = 12 (144/264).
  assert.deepEqual(waveSlices(device(132), VEC4_128, { m: 384, n: 512, k: 3200 }, 1, 4), [10, 12]);
  // A batch of 4 one-tile products over k = 4096: 33 and more wanted, capped at 16.
  assert.deepEqual(waveSlices(device(132), VEC4_128, { m: 128, n: 128, k: 4096 }, 4, 4), [16]);
  // k = 511 cannot make two slices of 256.
  assert.deepEqual(waveSlices(device(132), VEC4_128, { m: 128, n: 128, k: 511 }, 1), []);
});

Deno.test("split-K: a reduction past lavapipe's loop cap is split until every slice fits it", () => {
  const LAVAPIPE = 65535 - 1024;
  const SHARED: MatmulTiling = { variant: "shared", tm: 4, tn: 4, wgx: 16, wgy: 16, tk: 16 };
  // Not splitting otherwise (target 0): the register tiling loops k times, so 64511 fits and
  // 64512 needs 2 slices; 200000 needs ⌈200000/64511⌉ = 4; 2^23 needs 131, past the 64 cap.
  const capped = device(132, LAVAPIPE, 0);
  assert.equal(gemmSlices(capped, DEFAULT_TILING, 1, 64511), 1);
  assert.equal(gemmSlices(capped, DEFAULT_TILING, 1, 64512), 2);
  assert.equal(gemmSlices(capped, DEFAULT_TILING, 300, 200000), 4);
  assert.equal(gemmSlices(capped, DEFAULT_TILING, 1, 2 ** 23), 131);
  // The shared tiling loops twice per k (its tile loads): 100000 is 200000 iterations, 4 slices.
  assert.equal(gemmSlices(capped, SHARED, 1, 100000), 4);
  // No cap (a GPU): never split with target 0.
  assert.equal(gemmSlices(device(132, Infinity, 0), DEFAULT_TILING, 1, 2 ** 23), 1);
  // With a target the larger count wins: 8 workgroups over 3 tiles want ⌈8/3⌉ = 3 slices,
  // the cap 1 (4096 iterations); the blocked tiling's 2^20/8 = 131072 iterations need 3,
  // 256 workgroups over one tile want 64.
  assert.equal(gemmSlices(device(132, LAVAPIPE, 8), DEFAULT_TILING, 3, 4096), 3);
  assert.equal(gemmSlices(device(132, LAVAPIPE, 1), BLOCKED_128, 1, 2 ** 20), 3);
  assert.equal(gemmSlices(device(132, LAVAPIPE, 256), BLOCKED_128, 1, 2 ** 20), 64);
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
