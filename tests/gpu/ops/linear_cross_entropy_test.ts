/**
 * `linearCrossEntropy(h, W, targets)`, the head and its cross-entropy in
 * chunks of rows: loss and both gradients equal `crossEntropy(linear(h, W))`
 * (each checked against f64 in its own tests) within f32 rounding, at odd
 * shapes and every chunking, in f32 and under f16 and bf16 autocast, with
 * ignored rows; a step's peak memory drops by at least the logits' size; and
 * `copyInto`, which places the chunks' rows (and a KV cache's), against host
 * arithmetic.
 */
import assert from "node:assert/strict";
import {
  autocast,
  concat,
  copyInto,
  crossEntropy,
  HalfstepError,
  linear,
  linearCrossEntropy,
  noGrad,
  RandomGenerator,
  type Reduction,
  split,
  Tensor,
  tidy,
} from "../../../mod.ts";
import { assertClose, type Tolerance } from "../../helpers/assert.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";

interface Case {
  rows: number;
  features: number;
  classes: number;
}

/** Rows, features and classes that are multiples of no tile. */
const CASES: Case[] = [
  { rows: 13, features: 19, classes: 37 },
  { rows: 1, features: 8, classes: 5 },
  { rows: 33, features: 24, classes: 515 },
];

/** The loss and the gradients of h and W, read back: fused (chunkRows) or unfused (null). */
async function run(
  c: Case,
  chunkRows: number | null,
  options: { reduction: Reduction; amp: false | "f16" | "bf16"; ignore: boolean },
): Promise<Float32Array[]> {
  const rng = new RandomGenerator(c.rows * 1000 + c.classes);
  const grad = { requiresGrad: true };
  const h = Tensor.from(rng.uniform(c.rows * c.features, -2, 2), [c.rows, c.features], grad);
  const w = Tensor.from(rng.uniform(c.classes * c.features, -1, 1), [c.classes, c.features], grad);
  const targets = Array.from(rng.uniform(c.rows), (u) => Math.floor(u * c.classes));
  if (options.ignore) { for (let i = 0; i < c.rows; i += 3) targets[i] = -100; }
  const { reduction } = options;
  const loss = autocast(
    () =>
      chunkRows === null
        ? crossEntropy(linear(h, w), targets, { reduction })
        : linearCrossEntropy(h, w, targets, { reduction, chunkRows }),
    { enabled: options.amp !== false, dtype: options.amp || "f16" },
  );
  // "none" gets a gradient per row (not all equal, so rows cannot be mixed up).
  const upstream = reduction === "none"
    ? Tensor.from(rng.uniform(c.rows, 0.5, 1.5), [c.rows])
    : Tensor.full([], 1);
  loss.backward({ gradient: upstream });
  const out = [await loss.read(), await h.grad!.read(), await w.grad!.read()] as Float32Array[];
  for (const t of [h, w, loss, upstream, h.grad, w.grad]) t?.dispose();
  return out;
}

/**
 * f32: the chunked products sum each row's features in the same order but
 * dW adds the chunks' partial sums, so values differ by a few f32 ulps of
 * terms of size ~1; 2e-6 + 1e-5 relative leaves room and would still catch a
 * row placed wrong or a chunk dropped (errors of order 1/rows).
 */
const F32: Tolerance = { atol: 2e-6, rtol: 1e-5 };
/**
 * Under autocast both paths round the same f16 (bf16) logits, except that a
 * chunk's product may pick another tiling: an f16 logit one ulp apart (2⁻¹¹
 * relative, 2⁻⁸ in bf16) moves a softmax term by as much.
 */
const HALF: Record<"f16" | "bf16", Tolerance> = {
  f16: { atol: 2e-3, rtol: 2e-3 },
  bf16: { atol: 1.6e-2, rtol: 1.6e-2 },
};

Deno.test({
  name: "linearCrossEntropy: loss, dh and dW equal crossEntropy(linear(h, W)) within f32 " +
    "rounding, every chunking, every reduction, ignored rows",
  ...GPU_TEST,
  async fn() {
    for (const c of CASES) {
      for (const reduction of ["mean", "sum", "none"] as const) {
        const options = { reduction, amp: false as const, ignore: c.rows > 1 };
        const expected = await run(c, null, options);
        for (const chunkRows of new Set([1, 4, 7, c.rows, c.rows + 5])) {
          const actual = await run(c, chunkRows, options);
          ["loss", "dh", "dW"].forEach((what, i) =>
            assertClose(
              actual[i],
              expected[i],
              F32,
              `${JSON.stringify(c)} ${reduction} ` +
                `chunkRows ${chunkRows}: ${what}`,
            )
          );
        }
      }
    }
  },
});

Deno.test({
  name: "linearCrossEntropy under f16 and bf16 autocast: equals the unfused head within the " +
    "half type's rounding; gradients of f32 h and W come in f32" +
    (gpu.f16 ? "" : " (f16 ignored: the adapter has no shader-f16)"),
  ...GPU_TEST,
  async fn() {
    for (const amp of gpu.f16 ? ["f16", "bf16"] as const : ["bf16"] as const) {
      const c = CASES[2], options = { reduction: "mean" as const, amp, ignore: true };
      const expected = await run(c, null, options);
      const actual = await run(c, 5, options);
      ["loss", "dh", "dW"].forEach((what, i) =>
        assertClose(actual[i], expected[i], HALF[amp], `${amp}: ${what}`)
      );
    }
  },
});

Deno.test({
  name: "linearCrossEntropy over feature pieces (h and W split along features, as a table too " +
    "large for one buffer is kept) equals the whole, and concat joins pieces back with gradients",
  ...GPU_TEST,
  async fn() {
    const rows = 11, classes = 29, sizes = [6, 4, 10];
    const features = sizes.reduce((a, b) => a + b);
    const rng = new RandomGenerator(12);
    const grad = { requiresGrad: true };
    const h = Tensor.from(rng.uniform(rows * features, -2, 2), [rows, features], grad);
    const w = Tensor.from(rng.uniform(classes * features, -1, 1), [classes, features], grad);
    const targets = Array.from(rng.uniform(rows), (u) => Math.floor(u * classes));
    const whole = linearCrossEntropy(h, w, targets, { chunkRows: 4 });
    whole.backward();
    const expected = [await whole.read(), await h.grad!.read(), await w.grad!.read()];
    h.grad = null;
    w.grad = null;
    const pieced = tidy(() =>
      linearCrossEntropy(split(h, sizes, -1), split(w, sizes, -1), targets, { chunkRows: 4 })
    );
    pieced.backward();
    const actual = [await pieced.read(), await h.grad!.read(), await w.grad!.read()];
    ["loss", "dh", "dW"].forEach((what, i) => assertClose(actual[i], expected[i], F32, what));
    // concat(split(x)) is x, and its gradient reaches each piece whole.
    const x = Tensor.from(rng.uniform(3 * features, -1, 1), [3, features], grad);
    const joined = tidy(() => concat(split(x, sizes, -1), -1));
    assert.deepEqual(await joined.read(), await x.read());
    const g = Tensor.from(rng.uniform(3 * features, -1, 1), [3, features]);
    joined.backward({ gradient: g });
    assert.deepEqual(await x.grad!.read(), await g.read());
    for (const t of [h, w, x, g, whole, pieced, joined, h.grad, w.grad, x.grad]) t?.dispose();
  },
});

Deno.test({
  name: "linearCrossEntropy: a step's peak memory drops by at least the logits' size, and " +
    "nothing outlives the step",
  ...GPU_TEST,
  async fn() {
    const rows = 192, features = 16, classes = 4099;
    const rng = new RandomGenerator(8);
    const grad = { requiresGrad: true };
    const h = Tensor.from(rng.uniform(rows * features, -1, 1), [rows, features], grad);
    const w = Tensor.from(rng.uniform(classes * features, -1, 1), [classes, features], grad);
    const targets = Array.from(rng.uniform(rows), (u) => Math.floor(u * classes));
    const peakOf = async (fused: boolean) => {
      await gpu.sync();
      const before = gpu.memoryStats().allocatedBytes;
      gpu.resetPeakMemory();
      const loss = tidy(() =>
        fused
          ? linearCrossEntropy(h, w, targets, { chunkRows: 16 })
          : crossEntropy(linear(h, w), targets)
      );
      loss.backward();
      for (const t of [loss, h.grad, w.grad]) t?.dispose();
      h.grad = null;
      w.grad = null;
      await gpu.sync();
      assert.equal(gpu.memoryStats().allocatedBytes, before, `fused ${fused}: nothing kept`);
      return gpu.memoryStats().peakBytes - before;
    };
    const unfused = await peakOf(false), fused = await peakOf(true);
    const logits = rows * classes * 4;
    assert.ok(
      unfused - fused >= logits,
      `peak above the inputs: unfused ${unfused}, fused ${fused} bytes; the logits are ${logits}`,
    );
    h.dispose();
    w.dispose();
  },
});

Deno.test({
  name: "linearCrossEntropy: clear errors for mismatched shapes, dtypes, ids and chunk sizes",
  ...GPU_TEST,
  fn() {
    const h = Tensor.zeros([3, 4]), w = Tensor.zeros([5, 4]);
    const refused = (fn: () => unknown, message: RegExp) =>
      assert.throws(fn, (e: unknown) => e instanceof HalfstepError && message.test(e.message));
    refused(() => linearCrossEntropy(h, Tensor.zeros([5, 3]), [0, 1, 2]), /weight \[classes/);
    refused(() => linearCrossEntropy(h, w, [0, 1]), /targets must be i32 \[3\]/);
    refused(() => linearCrossEntropy(h, w, [0, 1, 5]), /5/);
    refused(() => linearCrossEntropy(h, w, [0, 1, 2], { chunkRows: 0 }), /chunkRows/);
    refused(
      () => linearCrossEntropy(h, Tensor.zeros([5, 4], { dtype: "bf16" }), [0, 1, 2]),
      /share one float dtype/,
    );
    for (const t of [h, w]) t.dispose();
  },
});

Deno.test({
  name: "copyInto: writes a window along any axis in place, f32, f16 and bf16, and refuses " +
    "what does not fit",
  ...GPU_TEST,
  async fn() {
    const dtypes = gpu.f16 ? ["f32", "f16", "bf16"] as const : ["f32", "bf16"] as const;
    for (const dtype of dtypes) {
      // dst [2, 6, 2] (a cache: rows, positions, features), src [2, 2, 2] at positions 3..4.
      const dst = Tensor.from(Array.from({ length: 24 }, (_, i) => i), [2, 6, 2], { dtype });
      const src = Tensor.from([-1, -2, -3, -4, -5, -6, -7, -8], [2, 2, 2], { dtype });
      noGrad(() => copyInto(dst, src, { axis: 1, start: 3 }));
      const expected = Array.from({ length: 24 }, (_, i) => i);
      [[6, -1], [7, -2], [8, -3], [9, -4], [18, -5], [19, -6], [20, -7], [21, -8]]
        .forEach(([at, v]) => expected[at] = v);
      assert.deepEqual(Array.from(await dst.read()), expected, dtype);
      dst.dispose();
      src.dispose();
    }
    const dst = Tensor.zeros([2, 5], { dtype: "bf16" });
    assert.throws(
      () => copyInto(dst, Tensor.zeros([2, 1], { dtype: "bf16" }), { axis: 1, start: 1 }),
      /whole words/,
    );
    assert.throws(() =>
      copyInto(dst, Tensor.zeros([2, 3], { dtype: "bf16" }), {
        axis: 1,
        start: 3,
      }), /start \+ length/);
    assert.throws(() => copyInto(dst, Tensor.zeros([2, 2]), { axis: 1, start: 0 }), /dtype/);
    dst.dispose();
  },
});

/**
 * The head and its cross-entropy in f64 on the host: the mean (or sum) over
 * the rows whose target is not `ignoreIndex`, and the gradients of h and W.
 * Row by row, so a real vocabulary's logits are never all held.
 */
function linearCrossEntropy64(
  h: ArrayLike<number>,
  w: ArrayLike<number>,
  targets: number[],
  dims: { rows: number; features: number; classes: number },
  options: { ignoreIndex: number; reduction: "mean" | "sum" },
) {
  const { rows, features: f, classes } = dims;
  const kept = targets.filter((t) => t !== options.ignoreIndex).length;
  const per = options.reduction === "mean" ? 1 / kept : 1;
  const dh = new Float64Array(rows * f), dw = new Float64Array(classes * f);
  const logits = new Float64Array(classes);
  let loss = 0;
  for (let r = 0; r < rows; r++) {
    if (targets[r] === options.ignoreIndex) continue;
    let max = -Infinity;
    for (let c = 0; c < classes; c++) {
      let s = 0;
      for (let k = 0; k < f; k++) s += h[r * f + k] * w[c * f + k];
      logits[c] = s;
      if (s > max) max = s;
    }
    let sum = 0;
    for (let c = 0; c < classes; c++) sum += Math.exp(logits[c] - max);
    loss += (max + Math.log(sum) - logits[targets[r]]) * per;
    for (let c = 0; c < classes; c++) {
      const g = (Math.exp(logits[c] - max) / sum - (c === targets[r] ? 1 : 0)) * per;
      for (let k = 0; k < f; k++) {
        dh[r * f + k] += g * w[c * f + k];
        dw[c * f + k] += g * h[r * f + k];
      }
    }
  }
  return { loss, dh, dw };
}

Deno.test({
  name: "linearCrossEntropy with an ignoreIndex of its own (a real class id, not −100): those " +
    "rows add nothing to the loss and gradients, mean over the rest, against f64, every chunking",
  ...GPU_TEST,
  async fn() {
    const dims = { rows: 23, features: 9, classes: 41 }, ignoreIndex = 7;
    const rng = new RandomGenerator(47);
    const hv = rng.uniform(dims.rows * dims.features, -2, 2);
    const wv = rng.uniform(dims.classes * dims.features, -1, 1);
    const targets = Array.from(rng.uniform(dims.rows), (u) => Math.floor(u * dims.classes));
    for (let r = 0; r < dims.rows; r += 4) targets[r] = ignoreIndex; // 6 rows ignored
    for (const reduction of ["mean", "sum"] as const) {
      const want = linearCrossEntropy64(hv, wv, targets, dims, { ignoreIndex, reduction });
      for (const chunkRows of [undefined, 5]) {
        const grad = { requiresGrad: true };
        const h = Tensor.from(hv, [dims.rows, dims.features], grad);
        const w = Tensor.from(wv, [dims.classes, dims.features], grad);
        const loss = linearCrossEntropy(h, w, targets, { ignoreIndex, reduction, chunkRows });
        loss.backward();
        const what = `${reduction}, chunkRows ${chunkRows ?? "default"}`;
        assertClose(await loss.read(), [want.loss], F32, `${what}: loss`);
        assertClose(await h.grad!.read(), want.dh, F32, `${what}: dh`);
        assertClose(await w.grad!.read(), want.dw, F32, `${what}: dW`);
        for (const t of [h, w, loss, h.grad, w.grad]) t?.dispose();
      }
    }
  },
});

Deno.test({
  name: "linearCrossEntropy at GPT-2's vocabulary (50257) with its default chunk size: loss and " +
    "gradients against f64 over several chunks, and its peak far below the whole logits",
  ...GPU_TEST,
  async fn() {
    const dims = { rows: 700, features: 8, classes: 50257 };
    const rng = new RandomGenerator(50257);
    const hv = rng.uniform(dims.rows * dims.features, -1, 1);
    const wv = rng.uniform(dims.classes * dims.features, -0.5, 0.5);
    const targets = Array.from(rng.uniform(dims.rows), (u) => Math.floor(u * dims.classes));
    const want = linearCrossEntropy64(hv, wv, targets, dims, {
      ignoreIndex: -100,
      reduction: "mean",
    });
    const grad = { requiresGrad: true };
    const h = Tensor.from(hv, [dims.rows, dims.features], grad);
    const w = Tensor.from(wv, [dims.classes, dims.features], grad);
    await gpu.sync();
    gpu.resetPeakMemory();
    const before = gpu.memoryStats().allocatedBytes;
    const loss = linearCrossEntropy(h, w, targets); // the default chunk: 166 rows
    loss.backward();
    await gpu.sync();
    const peak = gpu.memoryStats().peakBytes - before;
    const logitsBytes = 4 * dims.rows * dims.classes; // 141 MB
    assert.ok(peak < logitsBytes / 2, `peak ${peak} B, the whole logits ${logitsBytes} B`);
    assertClose(await loss.read(), [want.loss], F32, "loss");
    assertClose(await h.grad!.read(), want.dh, F32, "dh");
    // dW sums 700 rows' small terms in chunks: f32 partial sums of ~1e-5-sized values.
    assertClose(await w.grad!.read(), want.dw, { atol: 1e-8, rtol: 1e-4 }, "dW");
    for (const t of [h, w, loss, h.grad, w.grad]) t?.dispose();
  },
});
