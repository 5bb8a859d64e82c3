import assert from "node:assert/strict";
import { DTYPES, mul, sum, Tensor, tidy } from "../../../gpu/mod.ts";
import { batchNorm, batchNormCounter } from "../../../gpu/ops/batch_norm.ts";
import { GPU_TEST } from "../../helpers/gpu.ts";
import { gradcheck } from "../../helpers/gradcheck.ts";
import { quantize, uniform } from "../../helpers/reference.ts";
import { assertClose, TOL, type Tolerance } from "../../helpers/assert.ts";

/** Running statistics of the f64 reference (updated in place). */
interface Running64 {
  mean: Float64Array;
  var: Float64Array;
  /** Training batches seen (PyTorch's num_batches_tracked). */
  batches?: number;
}

/**
 * f64 BatchNorm of x viewed as [N, C, S], from the definition (PyTorch's
 * semantics), with its gradients for upstream `g`. Training mode updates `run`.
 */
function batchNorm64(
  x: Float64Array,
  g: Float64Array,
  [n, c, s]: number[],
  w: Float64Array,
  b: Float64Array,
  run: Running64,
  o: { training: boolean; momentum: number | null; eps: number },
) {
  const y = new Float64Array(x.length), dx = new Float64Array(x.length);
  const dw = new Float64Array(c), db = new Float64Array(c);
  const idx = (i: number, ch: number) => (Math.floor(i / s) * c + ch) * s + (i % s);
  const count = n * s;
  if (o.training) run.batches = (run.batches ?? 0) + 1;
  // momentum null: the cumulative average, factor 1 / batches seen (this one included).
  const m = o.momentum ?? 1 / run.batches!;
  for (let ch = 0; ch < c; ch++) {
    const xs = Array.from({ length: count }, (_, i) => x[idx(i, ch)]);
    const gs = Array.from({ length: count }, (_, i) => g[idx(i, ch)]);
    let mu = run.mean[ch], variance = run.var[ch];
    if (o.training) {
      mu = xs.reduce((a, v) => a + v, 0) / count;
      variance = xs.reduce((a, v) => a + (v - mu) ** 2, 0) / count;
      run.mean[ch] = (1 - m) * run.mean[ch] + m * mu;
      run.var[ch] = (1 - m) * run.var[ch] + m * variance * count / (count - 1);
    }
    const rstd = 1 / Math.sqrt(variance + o.eps);
    const xhat = xs.map((v) => (v - mu) * rstd);
    const sg = gs.reduce((a, v) => a + v, 0);
    const sgx = gs.reduce((a, v, i) => a + v * xhat[i], 0);
    dw[ch] = sgx;
    db[ch] = sg;
    for (let i = 0; i < count; i++) {
      y[idx(i, ch)] = xhat[i] * w[ch] + b[ch];
      // Training: μ and σ² depend on x too (the textbook BN backward); eval: they are constants.
      dx[idx(i, ch)] = o.training
        ? w[ch] * rstd * (gs[i] - sg / count - xhat[i] * sgx / count)
        : gs[i] * w[ch] * rstd;
    }
  }
  return { y, dx, dw, db };
}

/** [N, C, S] of a shape with channels on axis 1. */
const view = (shape: number[]) => [shape[0], shape[1], shape.slice(2).reduce((a, v) => a * v, 1)];

// dweight / dbias: f32 sums of up to 189 terms of size ≤ ~3.
const SUM_TOL: Tolerance = { atol: 1e-4, rtol: 1e-4 };
// The running variance has the factor n/(n − 1) and a few f32 roundings per step.
const STAT_TOL: Tolerance = { atol: 1e-6, rtol: 1e-5 };

const SHAPES = [[7, 5], [257, 3], [2, 3, 129], [3, 5, 7, 9], [1, 2, 1, 3]];

Deno.test({
  name: "batchNorm: forward, backward and running statistics match f64 over several steps, " +
    "training and eval, f32, f16 and bf16 input",
  ...GPU_TEST,
  async fn() {
    for (const shape of SHAPES) {
      for (const dtype of DTYPES) {
        for (const momentum of dtype === "f32" ? [0.1, 0.35, null] : [0.1]) {
          const [n, c, s] = view(shape), size = n * c * s;
          const label = `${dtype} [${shape}] momentum ${momentum}`;
          const w = quantize(uniform(c, 1, 0.5, 1.5), "f32");
          const b = quantize(uniform(c, 2), "f32");
          const run: Running64 = { mean: uniform(c, 3, -0.2, 0.2), var: uniform(c, 4, 0.5, 2) };
          const rm = Tensor.from(run.mean, [c]), rv = Tensor.from(run.var, [c]);
          const counter = Tensor.from([0], [], { dtype: "i32" });
          const tw = Tensor.from(w, [c], { requiresGrad: true });
          const tb = Tensor.from(b, [c], { requiresGrad: true });
          // Three training steps on different batches (shifted so the means differ), then eval.
          for (let step = 0; step < 4; step++) {
            const training = step < 3;
            const x = quantize(uniform(size, 10 + step, -1 + step, 2 + 0.5 * step), dtype);
            const g = quantize(uniform(size, 20 + step), dtype);
            const tx = Tensor.from(x, shape, { dtype, requiresGrad: true });
            const y = batchNorm(tx, {
              weight: tw,
              bias: tb,
              runningMean: rm,
              runningVar: rv,
              training,
              momentum,
              numBatchesTracked: counter,
            });
            const ref = batchNorm64(x, g, [n, c, s], w, b, run, { training, momentum, eps: 1e-5 });
            const what = `${label} step ${step} (${training ? "training" : "eval"})`;
            assert.equal(y.dtype, dtype);
            // f16: only the storage of y and dx is f16 (relative half-ulp 4.9e-4 of values up to
            // ~4), the inputs were rounded before the reference ran: TOL.f16; bf16 likewise
            // (half-ulp 3.9e-3): TOL.bf16. f32: TOL.f32.
            assertClose(await y.read(), ref.y, TOL[dtype], `y ${what}`);
            y.backward({ gradient: Tensor.from(g, shape, { dtype }) });
            assert.equal(tx.grad!.dtype, dtype);
            assertClose(await tx.grad!.read(), ref.dx, TOL[dtype], `dx ${what}`);
            assertClose(await tw.grad!.read(), ref.dw, SUM_TOL, `dweight ${what}`);
            assertClose(await tb.grad!.read(), ref.db, SUM_TOL, `dbias ${what}`);
            // Parameters, their gradients and the statistics stay f32 for a half input.
            for (const t of [tw, tb, tw.grad!, tb.grad!, rm, rv]) assert.equal(t.dtype, "f32");
            assertClose(await rm.read(), run.mean, STAT_TOL, `runningMean ${what}`);
            assertClose(await rv.read(), run.var, STAT_TOL, `runningVar ${what}`);
            assert.equal((await counter.read())[0], run.batches, `numBatchesTracked ${what}`);
            for (const t of [tw, tb, tx]) {
              t.grad!.dispose();
              t.grad = null;
            }
            tx.dispose();
            y.dispose();
          }
          for (const t of [tw, tb, rm, rv, counter]) t.dispose();
        }
      }
    }
  },
});

Deno.test({
  name: "batchNorm: updateRunningStats false leaves the statistics bit-identical; " +
    "no weight and bias",
  ...GPU_TEST,
  async fn() {
    const shape = [4, 3, 5], [n, c, s] = view(shape);
    const x = uniform(n * c * s, 1, -2, 2), g = uniform(n * c * s, 2);
    const rm = Tensor.from(uniform(c, 3), [c]), rv = Tensor.from(uniform(c, 4, 0.5, 2), [c]);
    const bits = async (t: Tensor) => new Uint32Array((await t.read()).buffer);
    const [m0, v0] = [await bits(rm), await bits(rv)];
    const tx = Tensor.from(x, shape, { requiresGrad: true });
    const y = batchNorm(tx, {
      runningMean: rm,
      runningVar: rv,
      training: true,
      updateRunningStats: false,
    });
    y.backward({ gradient: Tensor.from(g, shape) });
    assert.deepEqual(await bits(rm), m0);
    assert.deepEqual(await bits(rv), v0);
    // Still normalised with the batch statistics, and no affine term.
    const ones = new Float64Array(c).fill(1), zeros = new Float64Array(c);
    const run = { mean: new Float64Array(c), var: new Float64Array(c) };
    const ref = batchNorm64(x, g, [n, c, s], ones, zeros, run, {
      training: true,
      momentum: 0.1,
      eps: 1e-5,
    });
    assertClose(await y.read(), ref.y, TOL.f32, "y");
    assertClose(await tx.grad!.read(), ref.dx, TOL.f32, "dx");
    // Eval mode without weight and bias: the running statistics (still unchanged) normalise.
    const run2 = {
      mean: Float64Array.from(await rm.read()),
      var: Float64Array.from(await rv.read()),
    };
    const ev = batchNorm(tx, { runningMean: rm, runningVar: rv, training: false });
    const ref2 = batchNorm64(x, g, [n, c, s], ones, zeros, run2, {
      training: false,
      momentum: 0.1,
      eps: 1e-5,
    });
    tx.grad!.dispose();
    tx.grad = null;
    ev.backward({ gradient: Tensor.from(g, shape) });
    assertClose(await ev.read(), ref2.y, TOL.f32, "eval y");
    assertClose(await tx.grad!.read(), ref2.dx, TOL.f32, "eval dx");
    for (const t of [tx.grad!, tx, y, ev, rm, rv]) t.dispose();
  },
});

Deno.test({
  name: "batchNorm: gradients agree with finite differences in training and eval mode",
  ...GPU_TEST,
  async fn() {
    const shape = [5, 3, 2], size = 30;
    const r = Tensor.from(uniform(size, 9), shape);
    const rm = Tensor.from(uniform(3, 5), [3]), rv = Tensor.from(uniform(3, 6, 0.5, 2), [3]);
    for (const training of [true, false]) {
      await gradcheck(
        `batchNorm ${training ? "training" : "eval"}`,
        ([x, w, b]) =>
          sum(
            mul(
              batchNorm(x, {
                weight: w,
                bias: b,
                runningMean: rm,
                runningVar: rv,
                training,
                updateRunningStats: false,
              }),
              r,
            ),
          ),
        [uniform(size, 1, -2, 2), uniform(3, 2, 0.5, 1.5), uniform(3, 3)],
        [shape, [3], [3]],
      );
    }
    for (const t of [r, rm, rv]) t.dispose();
  },
});

Deno.test({
  name: "batchNorm: wrong dtypes, shapes and a single value per channel are clear errors",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const x = Tensor.zeros([4, 3], { dtype: "f16" });
      const v = Tensor.zeros([3]), run = { training: true };
      const f16 = Tensor.zeros([3], { dtype: "f16" });
      assert.throws(
        () => batchNorm(x, { weight: f16, bias: v, runningMean: v, runningVar: v, ...run }),
        /batchNorm: weight is f16 \[3\], but BatchNorm keeps its parameters and statistics in fp32/,
      );
      assert.throws(
        () => batchNorm(x, { runningMean: v, runningVar: f16, ...run }),
        /batchNorm: runningVar is f16 \[3\], but BatchNorm keeps its parameters and statistics/,
      );
      assert.throws(
        () => batchNorm(x, { bias: Tensor.zeros([4]), runningMean: v, runningVar: v, ...run }),
        /batchNorm: bias is f32 \[4\], but input f16 \[4, 3\] has 3 channels \(axis 1\)/,
      );
      assert.throws(
        () => batchNorm(Tensor.zeros([3]), { runningMean: v, runningVar: v, ...run }),
        /batchNorm: input f32 \[3\] must be \[N, C\], \[N, C, L\] or \[N, C, H, W\]/,
      );
      assert.throws(
        () =>
          batchNorm(Tensor.zeros([4, 3], { dtype: "i32" }), {
            runningMean: v,
            runningVar: v,
            ...run,
          }),
        /batchNorm: input i32 \[4, 3\] must be f32, f16 or bf16/,
      );
      assert.throws(
        () => batchNorm(Tensor.zeros([1, 3, 1, 1]), { runningMean: v, runningVar: v, ...run }),
        /batchNorm: expected more than 1 value per channel when training/,
      );
      assert.throws(
        () => batchNorm(x, { runningMean: v, runningVar: v, training: true, momentum: 2 }),
        /batchNorm: momentum must be in \[0, 1\]/,
      );
      assert.throws(
        () => batchNorm(x, { runningMean: v, runningVar: v, ...run, numBatchesTracked: v }),
        /batchNorm: numBatchesTracked must be an i32 tensor of one element, got f32 \[3\]/,
      );
      const needsGrad = Tensor.zeros([3], { requiresGrad: true });
      assert.throws(
        () => batchNorm(x, { runningMean: needsGrad, runningVar: v, ...run }),
        /runningMean and runningVar are updated in place and must not require grad/,
      );
      // One value per channel is fine in eval mode.
      batchNorm(Tensor.zeros([1, 3]), {
        runningMean: v,
        runningVar: Tensor.full([3], 1),
        training: false,
      });
    });
  },
});

Deno.test({
  name: "batchNorm: momentum null without a counter keeps its own, as the BatchNorm layer does " +
    "(cumulative average over every training batch, across tidy scopes; eval does not count)",
  ...GPU_TEST,
  async fn() {
    const [n, c] = [6, 3];
    const run: Running64 = { mean: new Float64Array(c), var: new Float64Array(c).fill(1) };
    const rm = Tensor.zeros([c]), rv = Tensor.full([c], 1);
    assert.equal(batchNormCounter(rm), null, "no counter before the first cumulative update");
    for (let step = 0; step < 5; step++) {
      const training = step !== 2; // an eval call in between neither moves nor counts
      const x = quantize(uniform(n * c, 30 + step, -1 - step, 2 + step), "f32");
      const g = new Float64Array(n * c);
      // Inside tidy: the counter must outlive the scope that created it.
      tidy(() =>
        batchNorm(Tensor.from(x, [n, c]), {
          runningMean: rm,
          runningVar: rv,
          training,
          momentum: null,
        })
      ).dispose();
      batchNorm64(x, g, [n, c, 1], new Float64Array(c).fill(1), new Float64Array(c), run, {
        training,
        momentum: null,
        eps: 1e-5,
      });
      assertClose(await rm.read(), run.mean, TOL.f32, `runningMean step ${step}`);
      assertClose(await rv.read(), run.var, TOL.f32, `runningVar step ${step}`);
      assert.equal((await batchNormCounter(rm)!.read())[0], run.batches ?? 0, `count ${step}`);
    }
    assert.equal(run.batches, 4);
    // A counter given explicitly is used instead (and the implicit one is left alone).
    const counter = Tensor.from([10], [], { dtype: "i32" });
    const x = Tensor.from(uniform(n * c, 40), [n, c]);
    batchNorm(x, {
      runningMean: rm,
      runningVar: rv,
      training: true,
      momentum: null,
      numBatchesTracked: counter,
    })
      .dispose();
    assert.equal((await counter.read())[0], 11);
    assert.equal((await batchNormCounter(rm)!.read())[0], 4);
    for (const t of [rm, rv, counter, x]) t.dispose();
  },
});
