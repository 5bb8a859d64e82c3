import assert from "node:assert/strict";
import { autocast, customAutocastLists } from "../../../amp/mod.ts";
import { DTYPES, mul, noGrad, sum, Tensor } from "../../../gpu/mod.ts";
import { flatten } from "../../../gpu/ops/flatten.ts";
import {
  adaptiveAvgPool2d,
  avgPool2d,
  type AvgPool2dOptions,
  maxPool2d,
  type MaxPool2dOptions,
} from "../../../gpu/ops/pool2d.ts";
import { AdaptiveAvgPool2d, AvgPool2d, Flatten, MaxPool2d } from "../../../nn/mod.ts";
import { assertClose, TOL } from "../../helpers/assert.ts";
import { GPU_TEST } from "../../helpers/gpu.ts";
import { gradcheck } from "../../helpers/gradcheck.ts";
import { quantize, rng, uniform } from "../../helpers/reference.ts";

type Pair = [number, number];

/** A pooling window: size, stride, padding and dilation along [y, x]. */
interface Window {
  k: Pair;
  s: Pair;
  p: Pair;
  d: Pair;
}

/** PyTorch's output size without ceil mode. */
function outSize(size: number, k: number, s: number, p: number, d: number): number {
  return Math.floor((size + 2 * p - d * (k - 1) - 1) / s) + 1;
}

/**
 * The input positions of window (oy, ox), in row-major tap order, as flat
 * indices within the plane; taps that land in the padding are left out.
 */
function taps(oy: number, ox: number, h: number, w: number, win: Window): number[] {
  const out: number[] = [];
  for (let ky = 0; ky < win.k[0]; ky++) {
    for (let kx = 0; kx < win.k[1]; kx++) {
      const iy = oy * win.s[0] - win.p[0] + ky * win.d[0];
      const ix = ox * win.s[1] - win.p[1] + kx * win.d[1];
      if (iy >= 0 && iy < h && ix >= 0 && ix < w) out.push(iy * w + ix);
    }
  }
  return out;
}

/**
 * f64 max pooling of `planes` planes of h×w from the definition, and its
 * input gradient for output gradient g. Each window picks its first maximum
 * in tap order; a NaN is picked over anything and a later NaN over an
 * earlier one (PyTorch's `val > max || isnan(val)`). A window of padding
 * only gives −∞ and no gradient.
 */
function maxPool64(
  x: ArrayLike<number>,
  g: ArrayLike<number>,
  planes: number,
  h: number,
  w: number,
  win: Window,
) {
  const oh = outSize(h, win.k[0], win.s[0], win.p[0], win.d[0]);
  const ow = outSize(w, win.k[1], win.s[1], win.p[1], win.d[1]);
  const y = new Float64Array(planes * oh * ow), dx = new Float64Array(planes * h * w);
  for (let c = 0; c < planes; c++) {
    for (let oy = 0; oy < oh; oy++) {
      for (let ox = 0; ox < ow; ox++) {
        let pick = -1, nan = false;
        for (const t of taps(oy, ox, h, w, win)) {
          const v = x[c * h * w + t];
          if (Number.isNaN(v)) [pick, nan] = [t, true];
          else if (!nan && (pick < 0 || v > x[c * h * w + pick])) pick = t;
        }
        const o = (c * oh + oy) * ow + ox;
        y[o] = pick < 0 ? -Infinity : x[c * h * w + pick];
        if (pick >= 0) dx[c * h * w + pick] += g[o];
      }
    }
  }
  return { y, dx, shape: [oh, ow] };
}

/** f64 average pooling from the definition (dilation 1), and its input gradient. */
function avgPool64(
  x: ArrayLike<number>,
  g: ArrayLike<number>,
  planes: number,
  h: number,
  w: number,
  win: Window,
  countIncludePad: boolean,
) {
  const oh = outSize(h, win.k[0], win.s[0], win.p[0], 1);
  const ow = outSize(w, win.k[1], win.s[1], win.p[1], 1);
  const y = new Float64Array(planes * oh * ow), dx = new Float64Array(planes * h * w);
  for (let c = 0; c < planes; c++) {
    for (let oy = 0; oy < oh; oy++) {
      for (let ox = 0; ox < ow; ox++) {
        const inside = taps(oy, ox, h, w, win);
        const divisor = countIncludePad ? win.k[0] * win.k[1] : inside.length;
        const o = (c * oh + oy) * ow + ox;
        y[o] = inside.reduce((a, t) => a + x[c * h * w + t], 0) / divisor;
        for (const t of inside) dx[c * h * w + t] += g[o] / divisor;
      }
    }
  }
  return { y, dx, shape: [oh, ow] };
}

/** f64 adaptive average pooling: output i averages [⌊i·H/oh⌋, ⌈(i+1)·H/oh⌉) (both axes). */
function adaptiveAvgPool64(
  x: ArrayLike<number>,
  g: ArrayLike<number>,
  planes: number,
  h: number,
  w: number,
  oh: number,
  ow: number,
) {
  const y = new Float64Array(planes * oh * ow), dx = new Float64Array(planes * h * w);
  for (let c = 0; c < planes; c++) {
    for (let oy = 0; oy < oh; oy++) {
      const y0 = Math.floor((oy * h) / oh), y1 = Math.ceil(((oy + 1) * h) / oh);
      for (let ox = 0; ox < ow; ox++) {
        const x0 = Math.floor((ox * w) / ow), x1 = Math.ceil(((ox + 1) * w) / ow);
        const o = (c * oh + oy) * ow + ox, n = (y1 - y0) * (x1 - x0);
        for (let iy = y0; iy < y1; iy++) {
          for (let ix = x0; ix < x1; ix++) {
            y[o] += x[(c * h + iy) * w + ix] / n;
            dx[(c * h + iy) * w + ix] += g[o] / n;
          }
        }
      }
    }
  }
  return { y, dx };
}

/** Integers from a small set, so most windows hold ties (exact in f16 too). */
function ties(n: number, seed: number): Float64Array {
  const r = rng(seed);
  return Float64Array.from({ length: n }, () => Math.floor(r() * 5) - 3);
}

const SIZES: Pair[] = [[1, 7], [7, 9], [9, 33], [33, 1], [7, 7]];
const KERNELS: Pair[] = [[1, 1], [2, 2], [3, 3], [3, 1]];
const N = 2, C = 3;

/** Padding `p` clamped to half the kernel; null when that repeats padding 0. */
function paddingFor(k: Pair, p: number): Pair | null {
  const pad: Pair = [Math.min(p, k[0] >> 1), Math.min(p, k[1] >> 1)];
  return p > 0 && pad[0] === 0 && pad[1] === 0 ? null : pad;
}

Deno.test({
  name: "maxPool2d: forward and backward match f64 (ties: first maximum), odd shapes, " +
    "kernels 1/2/3/3×1, strides 1/2, padding 0/1, dilation 1/2, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    let cases = 0, tooSmall = 0;
    for (const [h, w] of SIZES) {
      for (const k of KERNELS) {
        for (const stride of [1, 2]) {
          for (const padding of [0, 1]) {
            const p = paddingFor(k, padding);
            if (!p) continue;
            for (const dilation of [1, 2]) {
              const win: Window = { k, s: [stride, stride], p, d: [dilation, dilation] };
              const options: MaxPool2dOptions = { kernelSize: k, stride, padding: p, dilation };
              const oh = outSize(h, k[0], stride, p[0], dilation);
              const ow = outSize(w, k[1], stride, p[1], dilation);
              const label: string = `[${h}, ${w}] ${JSON.stringify(options)}`;
              if (oh < 1 || ow < 1) {
                tooSmall++;
                const x = Tensor.zeros([N, C, h, w]);
                assert.throws(() => maxPool2d(x, options), /maxPool2d: input f32 .* too small/);
                x.dispose();
                continue;
              }
              for (const dtype of DTYPES) {
                const n = N * C * h * w;
                const x = ties(n, n + k[0] + stride + dilation);
                const g = quantize(uniform(N * C * oh * ow, oh * ow + 3), dtype);
                const ref = maxPool64(x, g, N * C, h, w, win);
                const tx = Tensor.from(x, [N, C, h, w], { dtype, requiresGrad: true });
                const y = maxPool2d(tx, options);
                assert.deepEqual(y.shape, [N, C, oh, ow], label);
                assert.equal(y.dtype, dtype);
                // Values are copied, never computed: exact in every dtype.
                assert.deepEqual(
                  Array.from(await y.read()),
                  Array.from(ref.y),
                  `y ${dtype} ${label}`,
                );
                y.backward({ gradient: Tensor.from(g, y.shape, { dtype }) });
                assert.equal(tx.grad!.dtype, dtype);
                // dx sums a few g in f32, stored in dx's dtype.
                assertClose(await tx.grad!.read(), ref.dx, TOL[dtype], `dx ${dtype} ${label}`);
                tx.grad!.dispose();
                tx.dispose();
                y.dispose();
                cases++;
              }
            }
          }
        }
      }
    }
    assert.ok(cases > 200 && tooSmall > 5, `${cases} cases, ${tooSmall} too small`);
  },
});

Deno.test({
  name: "maxPool2d: continuous values, rank-3 input, overlapping windows sum their gradients",
  ...GPU_TEST,
  async fn() {
    for (const dtype of DTYPES) {
      // [C, H, W] input: the same as N = 1.
      const [c, h, w] = [4, 33, 9];
      const x = quantize(uniform(c * h * w, 5, -3, 3), dtype);
      for (const [k, s, p] of [[3, 1, 1], [3, 2, 1], [2, 1, 0]] as const) {
        const win: Window = { k: [k, k], s: [s, s], p: [p, p], d: [1, 1] };
        const oh = outSize(h, k, s, p, 1), ow = outSize(w, k, s, p, 1);
        const g = quantize(uniform(c * oh * ow, 9), dtype);
        const ref = maxPool64(x, g, c, h, w, win);
        const tx = Tensor.from(x, [c, h, w], { dtype, requiresGrad: true });
        const y = maxPool2d(tx, { kernelSize: k, stride: s, padding: p });
        assert.deepEqual(y.shape, [c, oh, ow]);
        assertClose(await y.read(), ref.y, TOL[dtype], `y ${dtype} k${k} s${s}`);
        y.backward({ gradient: Tensor.from(g, y.shape, { dtype }) });
        assertClose(await tx.grad!.read(), ref.dx, TOL[dtype], `dx ${dtype} k${k} s${s}`);
        tx.grad!.dispose();
        tx.dispose();
        y.dispose();
      }
    }
    // A peak in the middle of a 3×3 input is the maximum of all four 2×2 windows
    // (stride 1) and of all four 3×3 windows with padding 1 and stride 2 … of every window.
    const peak = [0, 1, 0, 2, 9, 3, 0, 4, 0];
    for (
      const options of [{ kernelSize: 2, stride: 1 }, { kernelSize: 3, stride: 2, padding: 1 }]
    ) {
      const x = Tensor.from(peak, [1, 1, 3, 3], { requiresGrad: true });
      const y = maxPool2d(x, options);
      assert.deepEqual(Array.from(await y.read()), [9, 9, 9, 9]);
      y.backward({ gradient: Tensor.from([1, 2, 3, 4], y.shape) });
      assert.deepEqual(Array.from(await x.grad!.read()), [0, 0, 0, 0, 10, 0, 0, 0, 0]);
      x.grad!.dispose();
      x.dispose();
      y.dispose();
    }
    // Ties: the first maximum in row-major order of each window gets the gradient.
    const x = Tensor.from([1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 2, 4], { requiresGrad: true });
    const y = maxPool2d(x, { kernelSize: 2 });
    y.backward({ gradient: Tensor.from([5, 6], y.shape) });
    assert.deepEqual(Array.from(await x.grad!.read()), [5, 0, 6, 0, 0, 0, 0, 0]);
    x.grad!.dispose();
    x.dispose();
    y.dispose();
  },
});

Deno.test({
  name: "maxPool2d: NaN wins its window (the last NaN gets the gradient, as PyTorch); " +
    "padding counts as −∞; an all-padding window gives −∞ and no gradient",
  ...GPU_TEST,
  async fn() {
    for (const dtype of DTYPES) {
      const x = [1, NaN, 2, 3, -4, NaN, -5, -6, 7, 8, -9, -1, 0, 2, 2, 1];
      const g = [1, 2, 3, 4, 5, 6, 7, 8, 9];
      const win: Window = { k: [2, 2], s: [1, 1], p: [0, 0], d: [1, 1] };
      const ref = maxPool64(x, g, 1, 4, 4, win);
      const tx = Tensor.from(x, [1, 1, 4, 4], { dtype, requiresGrad: true });
      const y = maxPool2d(tx, { kernelSize: 2, stride: 1 });
      const got = Array.from(await y.read());
      assert.deepEqual(got.map(Number.isNaN), Array.from(ref.y, Number.isNaN), `NaNs ${dtype}`);
      assert.deepEqual(
        got.filter((v) => !Number.isNaN(v)),
        Array.from(ref.y).filter((v) => !Number.isNaN(v)),
      );
      y.backward({ gradient: Tensor.from(g, y.shape, { dtype }) });
      // Windows (0, 0) and (0, 1) hold both NaNs (at 1 and 5): their gradient goes to the
      // later one, 5, as does that of (1, 0) and (1, 1), which hold only it.
      assert.deepEqual(Array.from(await tx.grad!.read()), Array.from(ref.dx), `dx ${dtype}`);
      assert.deepEqual([ref.dx[1], ref.dx[5]], [0, 1 + 2 + 4 + 5]);
      tx.grad!.dispose();
      tx.dispose();
      y.dispose();

      // All-negative values next to padding: the padding never wins.
      const neg = Tensor.from([-3, -2, -1, -4], [1, 2, 2], { dtype });
      const m = maxPool2d(neg, { kernelSize: 3, stride: 1, padding: 1 });
      assert.deepEqual(Array.from(await m.read()), [-1, -1, -1, -1]);
      neg.dispose();
      m.dispose();

      // H = W = 2, k = 2, padding 1, dilation 3: the only window taps rows/cols −1 and 2.
      const small = Tensor.from([1, 2, 3, 4], [1, 1, 2, 2], { dtype, requiresGrad: true });
      const z = maxPool2d(small, { kernelSize: 2, padding: 1, dilation: 3 });
      assert.deepEqual(z.shape, [1, 1, 1, 1]);
      assert.deepEqual(Array.from(await z.read()), [-Infinity]);
      z.backward({ gradient: Tensor.from([1], z.shape, { dtype }) });
      assert.deepEqual(Array.from(await small.grad!.read()), [0, 0, 0, 0]);
      small.grad!.dispose();
      small.dispose();
      z.dispose();
    }
  },
});

Deno.test({
  name: "avgPool2d: forward and backward match f64, odd shapes, kernels 1/2/3/3×1, " +
    "strides 1/2, padding 0/1, countIncludePad both ways, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    let cases = 0;
    for (const [h, w] of SIZES) {
      for (const k of KERNELS) {
        for (const stride of [1, 2]) {
          for (const padding of [0, 1]) {
            const p = paddingFor(k, padding);
            if (!p) continue;
            const oh = outSize(h, k[0], stride, p[0], 1), ow = outSize(w, k[1], stride, p[1], 1);
            if (oh < 1 || ow < 1) continue;
            for (const countIncludePad of [true, false]) {
              const win: Window = { k, s: [stride, stride], p, d: [1, 1] };
              const options: AvgPool2dOptions = {
                kernelSize: k,
                stride,
                padding: p,
                countIncludePad,
              };
              const label: string = `[${h}, ${w}] ${JSON.stringify(options)}`;
              for (const dtype of DTYPES) {
                const n = N * C * h * w;
                const x = quantize(uniform(n, n + k[1], -2, 3), dtype);
                const g = quantize(uniform(N * C * oh * ow, oh + ow), dtype);
                const ref = avgPool64(x, g, N * C, h, w, win, countIncludePad);
                const tx = Tensor.from(x, [N, C, h, w], { dtype, requiresGrad: true });
                const y = avgPool2d(tx, options);
                assert.deepEqual(y.shape, [N, C, oh, ow], label);
                assert.equal(y.dtype, dtype);
                assertClose(await y.read(), ref.y, TOL[dtype], `y ${dtype} ${label}`);
                y.backward({ gradient: Tensor.from(g, y.shape, { dtype }) });
                assert.equal(tx.grad!.dtype, dtype);
                assertClose(await tx.grad!.read(), ref.dx, TOL[dtype], `dx ${dtype} ${label}`);
                tx.grad!.dispose();
                tx.dispose();
                y.dispose();
                cases++;
              }
            }
          }
        }
      }
    }
    assert.ok(cases > 150, `${cases} cases`);
    // Rank 3, and a 3×3 window of ones at a corner with padding 1: 4/9 or 4/4.
    const ones = Tensor.full([1, 3, 3], 1);
    const included = avgPool2d(ones, { kernelSize: 3, stride: 2, padding: 1 });
    const excluded = avgPool2d(ones, {
      kernelSize: 3,
      stride: 2,
      padding: 1,
      countIncludePad: false,
    });
    assert.deepEqual(included.shape, [1, 2, 2]);
    assertClose(await included.read(), [4 / 9, 4 / 9, 4 / 9, 4 / 9], TOL.f32, "countIncludePad");
    assertClose(await excluded.read(), [1, 1, 1, 1], TOL.f32, "countIncludePad: false");
    for (const t of [ones, included, excluded]) t.dispose();
  },
});

Deno.test({
  name: "adaptiveAvgPool2d: global and general output sizes (overlapping, uneven and " +
    "upsampling windows) match f64, forward and backward, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    let cases = 0;
    for (const [h, w] of SIZES) {
      for (const size of [1, [2, 3], [5, 4], [null, 3], [h + 2, 1]] as const) {
        const oh = typeof size === "number" ? size : size[0] ?? h;
        const ow = typeof size === "number" ? size : size[1] ?? w;
        for (const dtype of DTYPES) {
          const n = N * C * h * w, label = `[${h}, ${w}] → ${JSON.stringify(size)} ${dtype}`;
          const x = quantize(uniform(n, n + oh, -2, 2), dtype);
          const g = quantize(uniform(N * C * oh * ow, ow + 1), dtype);
          const ref = adaptiveAvgPool64(x, g, N * C, h, w, oh, ow);
          const tx = Tensor.from(x, [N, C, h, w], { dtype, requiresGrad: true });
          const y = adaptiveAvgPool2d(tx, size as number | [number | null, number | null]);
          assert.deepEqual(y.shape, [N, C, oh, ow], label);
          assert.equal(y.dtype, dtype);
          assertClose(await y.read(), ref.y, TOL[dtype], `y ${label}`);
          y.backward({ gradient: Tensor.from(g, y.shape, { dtype }) });
          assertClose(await tx.grad!.read(), ref.dx, TOL[dtype], `dx ${label}`);
          tx.grad!.dispose();
          tx.dispose();
          y.dispose();
          cases++;
        }
      }
    }
    assert.equal(cases, 75);
    // Global average pooling of an unbatched [C, H, W] input.
    const x = Tensor.from(uniform(2 * 9 * 33, 3), [2, 9, 33]);
    const y = adaptiveAvgPool2d(x, [1, 1]);
    assert.deepEqual(y.shape, [2, 1, 1]);
    const v = Array.from(await x.read());
    const means = [0, 1].map((c) => v.slice(c * 297, (c + 1) * 297).reduce((a, b) => a + b) / 297);
    assertClose(await y.read(), means, TOL.f32, "global mean");
    x.dispose();
    y.dispose();
  },
});

Deno.test({
  name: "pooling: gradients agree with finite differences",
  ...GPU_TEST,
  async fn() {
    // Distinct values 0.1 apart: the finite-difference step (1e-2) never changes a window's argmax.
    const r = rng(3);
    const distinct = Float64Array.from({ length: 2 * 3 * 7 * 9 }, (_, i) => i * 0.1)
      .sort(() => r() - 0.5);
    const weights = Tensor.from(uniform(2 * 3 * 4 * 5, 4), [2, 3, 4, 5]);
    await gradcheck(
      "maxPool2d",
      ([x]) => sum(mul(maxPool2d(x, { kernelSize: 3, stride: 2, padding: 1 }), weights)),
      [distinct],
      [[2, 3, 7, 9]],
    );
    await gradcheck(
      "avgPool2d",
      ([x]) =>
        sum(
          mul(
            avgPool2d(x, { kernelSize: 3, stride: 2, padding: 1, countIncludePad: false }),
            weights,
          ),
        ),
      [uniform(2 * 3 * 7 * 9, 5)],
      [[2, 3, 7, 9]],
    );
    const w2 = Tensor.from(uniform(2 * 3 * 3 * 4, 6), [2, 3, 3, 4]);
    await gradcheck(
      "adaptiveAvgPool2d",
      ([x]) => sum(mul(adaptiveAvgPool2d(x, [3, 4]), w2)),
      [uniform(2 * 3 * 7 * 9, 7)],
      [[2, 3, 7, 9]],
    );
    weights.dispose();
    w2.dispose();
  },
});

Deno.test({
  name: "pooling: clear errors for bad ranks, dtypes, options and inputs too small",
  ...GPU_TEST,
  fn() {
    const x = Tensor.zeros([2, 3, 4, 4]);
    const flat = Tensor.zeros([4, 4]);
    const ids = Tensor.from([1, 2, 3, 4], [1, 1, 2, 2], { dtype: "i32" });
    for (
      const [name, pool] of [
        ["maxPool2d", (t: Tensor, o: object) => maxPool2d(t, { kernelSize: 2, ...o })],
        ["avgPool2d", (t: Tensor, o: object) => avgPool2d(t, { kernelSize: 2, ...o })],
      ] as const
    ) {
      assert.throws(
        () => pool(flat, {}),
        new RegExp(
          `${name}: input f32 \\[4, 4\\] must be \\[N, C, H, W\\] or unbatched \\[C, H, W\\]`,
        ),
      );
      assert.throws(
        () => pool(ids, {}),
        new RegExp(`${name}: input i32 \\[1, 1, 2, 2\\] must be f32, f16 or bf16`),
      );
      assert.throws(
        () => pool(x, { kernelSize: 0 }),
        /kernelSize must be a positive integer or a pair/,
      );
      assert.throws(() => pool(x, { kernelSize: 1.5 }), /kernelSize must be .* got 1\.5/);
      assert.throws(() => pool(x, { kernelSize: [2] }), /kernelSize must be .* got \[2\]/);
      assert.throws(() => pool(x, { stride: 0 }), /stride must be a positive integer/);
      assert.throws(() => pool(x, { stride: [1, -2] }), /stride must be a positive integer/);
      assert.throws(() => pool(x, { padding: -1 }), /padding must be an integer ≥ 0/);
      assert.throws(
        () => pool(x, { ceilMode: 1 }),
        new RegExp(`${name}: ceilMode must be true or false, got 1`),
      );
      assert.throws(
        () => pool(x, { kernelSize: 3, padding: [1, 2] }),
        new RegExp(
          `${name}: padding \\[1, 2\\] must be at most half of the kernel size \\[3, 3\\]`,
        ),
      );
      assert.throws(
        () => pool(x, { kernelSize: 5 }),
        new RegExp(
          `${name}: input f32 \\[2, 3, 4, 4\\] is too small for kernel \\[5, 5\\] with ` +
            "padding \\[0, 0\\]: the output would be \\[0, 0\\]",
        ),
      );
      // Several problems are reported at once, one per line.
      assert.throws(
        () => pool(x, { kernelSize: 0, stride: "2" }),
        (e: Error) =>
          e.name === "ValueError" && /kernelSize/.test(e.message) && /stride/.test(e.message),
      );
    }
    assert.throws(
      () => maxPool2d(x, { kernelSize: 2, dilation: 0 }),
      /dilation must be a positive integer/,
    );
    assert.throws(
      () => maxPool2d(x, { kernelSize: 3, dilation: 2 }),
      /too small for kernel \[3, 3\] with padding \[0, 0\] and dilation \[2, 2\]/,
    );
    assert.throws(
      // @ts-expect-error: plain JavaScript may pass anything
      () => avgPool2d(x, { kernelSize: 2, countIncludePad: "yes" }),
      /avgPool2d: countIncludePad must be true or false/,
    );
    for (const divisorOverride of [0, 1.5]) {
      assert.throws(
        () => avgPool2d(x, { kernelSize: 2, divisorOverride }),
        new RegExp(
          `avgPool2d: divisorOverride must be a nonzero integer or null, got ${divisorOverride}`,
        ),
      );
    }
    assert.throws(
      // @ts-expect-error: plain JavaScript may pass anything
      () => maxPool2d(x, { kernelSize: 2, returnIndices: "yes" }),
      /maxPool2d: returnIndices must be true or false, got "yes"/,
    );
    assert.throws(
      // @ts-expect-error: plain JavaScript may forget the options
      () => maxPool2d(x),
      /maxPool2d: options must be an object such as \{ kernelSize: 2 \}/,
    );
    assert.throws(
      () => adaptiveAvgPool2d(flat, 1),
      /adaptiveAvgPool2d: input f32 \[4, 4\] must be/,
    );
    assert.throws(
      () => adaptiveAvgPool2d(ids, 1),
      /adaptiveAvgPool2d: input i32 .* must be f32, f16 or bf16/,
    );
    for (const bad of [0, 1.5, [1], [2, 0], -1]) {
      assert.throws(
        () => adaptiveAvgPool2d(x, bad as number),
        /adaptiveAvgPool2d: outputSize must be a positive integer or a pair/,
      );
    }
    const empty = Tensor.zeros([1, 1, 0, 3]);
    assert.throws(() => adaptiveAvgPool2d(empty, 1), /has an empty spatial axis/);
    assert.throws(() => maxPool2d(empty, { kernelSize: 1 }), /too small/);
    for (const t of [x, flat, ids, empty]) t.dispose();
  },
});

Deno.test({
  name: "pooling: empty batches, autocast consults the pool ops, no indices kept without grad",
  ...GPU_TEST,
  async fn() {
    const none = Tensor.zeros([0, 3, 5, 5]);
    const pooled = [
      maxPool2d(none, { kernelSize: 2 }),
      avgPool2d(none, { kernelSize: 2 }),
      adaptiveAvgPool2d(none, 1),
    ];
    assert.deepEqual(pooled.map((t) => t.shape), [[0, 3, 2, 2], [0, 3, 2, 2], [0, 3, 1, 1]]);
    for (const t of [none, ...pooled]) t.dispose();

    const x = Tensor.from(uniform(2 * 8 * 8, 1), [2, 1, 8, 8]);
    // Default policy: pooling follows its input (f32 stays f32).
    const same = autocast(() => maxPool2d(x, { kernelSize: 2 }));
    assert.equal(same.dtype, "f32");
    // A policy that lists the pool ops as f16 casts their inputs down.
    const lists = customAutocastLists({
      allow: ["max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"],
    });
    const down = autocast(() => [
      maxPool2d(x, { kernelSize: 2 }),
      avgPool2d(x, { kernelSize: 2 }),
      adaptiveAvgPool2d(x, 1),
    ], { lists });
    assert.deepEqual(down.map((t) => t.dtype), ["f16", "f16", "f16"]);
    assertClose(await down[0].read(), await same.read(), TOL.f16, "autocast maxPool2d");

    // Without grad nothing is recorded (and no argmax buffer outlives the call).
    const leaf = Tensor.from(uniform(2 * 8 * 8, 2), [2, 1, 8, 8], { requiresGrad: true });
    const y = noGrad(() => maxPool2d(leaf, { kernelSize: 2 }));
    assert.equal(y.requiresGrad, false);
    assert.equal(y.gradFn, null);
    for (const t of [x, same, ...down, leaf, y]) t.dispose();
  },
});

Deno.test({
  name: "flatten: shapes as torch.flatten, values and memory unchanged, the gradient flows back",
  ...GPU_TEST,
  async fn() {
    const values = uniform(2 * 3 * 4 * 5, 1);
    const x = Tensor.from(values, [2, 3, 4, 5], { requiresGrad: true });
    const cases: [number[], number[]][] = [
      [[], [2, 60]],
      [[0], [120]],
      [[0, -1], [120]],
      [[1, 2], [2, 12, 5]],
      [[-2], [2, 3, 20]],
      [[2, 2], [2, 3, 4, 5]],
      [[0, 1], [6, 4, 5]],
      [[-4, -3], [6, 4, 5]],
    ];
    for (const [args, shape] of cases) {
      const y = flatten(x, ...args);
      assert.deepEqual(y.shape, shape, `flatten(x, ${args})`);
      assert.ok(y.sharesMemoryWith(x));
      y.dispose();
    }
    const y = flatten(x);
    assert.deepEqual(Array.from(await y.read()), Array.from(Float32Array.from(values)));
    const g = uniform(120, 2);
    y.backward({ gradient: Tensor.from(g, [2, 60]) });
    assert.deepEqual(x.grad!.shape, [2, 3, 4, 5]);
    assert.deepEqual(Array.from(await x.grad!.read()), Array.from(Float32Array.from(g)));
    const scalar = Tensor.from([7], []);
    for (const flat of [flatten(scalar, 0), flatten(scalar, -1, 0)]) {
      assert.deepEqual(flat.shape, [1]);
      flat.dispose();
    }
    assert.throws(() => flatten(scalar), /flatten: startDim 1 is out of range for input f32 \[\]/);
    assert.throws(
      () => flatten(x, 4),
      /flatten: startDim 4 is out of range for input f32 \[2, 3, 4, 5\]; use an axis in \[-4, 3\]/,
    );
    assert.throws(() => flatten(x, 0, -5), /endDim -5 is out of range/);
    assert.throws(
      () => flatten(x, -1, 1),
      /startDim -1 \(axis 3\) comes after endDim 1 \(axis 1\)/,
    );
    assert.throws(() => flatten(x, 2, 1), /flatten: startDim 2 comes after endDim 1/);
    assert.throws(() => flatten(x, 1.5), /flatten: startDim must be an integer/);
    for (const t of [x, x.grad!, y, scalar]) t.dispose();
  },
});

Deno.test({
  name: "MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten: forward equals the op, no " +
    "parameters, options checked in the constructor",
  ...GPU_TEST,
  async fn() {
    const x = Tensor.from(uniform(2 * 3 * 9 * 7, 8), [2, 3, 9, 7]);
    const pairs: [{ forward(x: Tensor): Tensor; parameters(): Tensor[] }, (x: Tensor) => Tensor][] =
      [
        [new MaxPool2d(2), (t) => maxPool2d(t, { kernelSize: 2 })],
        [
          new MaxPool2d({ kernelSize: [3, 1], stride: [2, 1], padding: [1, 0], dilation: [1, 2] }),
          (t) =>
            maxPool2d(t, { kernelSize: [3, 1], stride: [2, 1], padding: [1, 0], dilation: [1, 2] }),
        ],
        [new AvgPool2d([2, 3]), (t) => avgPool2d(t, { kernelSize: [2, 3] })],
        [
          new AvgPool2d({ kernelSize: 3, stride: 1, padding: 1, countIncludePad: false }),
          (t) => avgPool2d(t, { kernelSize: 3, stride: 1, padding: 1, countIncludePad: false }),
        ],
        [new AdaptiveAvgPool2d(1), (t) => adaptiveAvgPool2d(t, 1)],
        [new AdaptiveAvgPool2d([4, null]), (t) => adaptiveAvgPool2d(t, [4, null])],
        [new Flatten(), (t) => flatten(t)],
        [new Flatten(0, 2), (t) => flatten(t, 0, 2)],
      ];
    for (const [layer, op] of pairs) {
      const a = layer.forward(x), b = op(x);
      assert.deepEqual(a.shape, b.shape);
      assert.deepEqual(await a.read(), await b.read());
      assert.equal(layer.parameters().length, 0);
      a.dispose();
      b.dispose();
    }
    const pool = new MaxPool2d(3);
    assert.deepEqual([pool.kernelSize, pool.stride, pool.padding, pool.dilation], [[3, 3], [3, 3], [
      0,
      0,
    ], [1, 1]]);
    assert.equal(new AvgPool2d(2).countIncludePad, true);
    assert.equal(new MaxPool2d(2).stateDict().size, 0);
    assert.throws(() => new MaxPool2d(0), /MaxPool2d: kernelSize must be a positive integer/);
    assert.throws(
      () => new MaxPool2d({ kernelSize: 2, padding: 2 }),
      /MaxPool2d: padding \[2, 2\] must be at most half/,
    );
    assert.throws(() => new AvgPool2d({ kernelSize: 2, stride: -1 }), /AvgPool2d: stride must be/);
    assert.throws(() => new AdaptiveAvgPool2d(0), /AdaptiveAvgPool2d: outputSize must be/);
    assert.throws(() => new Flatten(0.5), /Flatten: startDim must be an integer/);
    assert.throws(() => new Flatten(-1, -2), /Flatten: startDim -1 comes after endDim -2/);
    x.dispose();
  },
});
