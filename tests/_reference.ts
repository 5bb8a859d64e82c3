/**
 * Independent f64 CPU references for every kernel and gradient rule. Written
 * from the textbook definitions, never from our WGSL.
 */

/** A seeded PRNG (mulberry32) so tests are reproducible. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** n values uniform in [lo, hi). */
export function uniform(n: number, seed: number, lo = -1, hi = 1): Float64Array {
  const r = rng(seed);
  return Float64Array.from({ length: n }, () => lo + (hi - lo) * r());
}

/** Values as the GPU stores them in `dtype` (f16 rounding), back in f64. */
export function quantize(values: ArrayLike<number>, dtype: "f32" | "f16"): Float64Array {
  const q = dtype === "f32" ? Float32Array.from(values) : Float16Array.from(values);
  return Float64Array.from(q);
}

/** C[b] = op(A[b])·op(B[b]); A stored [batch?, M, K] or [batch?, K, M] when transposed. */
export function matmul64(
  a: ArrayLike<number>,
  b: ArrayLike<number>,
  dims: {
    batch: number;
    m: number;
    n: number;
    k: number;
    transA: boolean;
    transB: boolean;
    shareB?: boolean;
  },
): Float64Array {
  const { batch, m, n, k, transA, transB } = dims;
  const c = new Float64Array(batch * m * n);
  for (let z = 0; z < batch; z++) {
    const ao = z * m * k, bo = dims.shareB ? 0 : z * k * n;
    for (let i = 0; i < m; i++) {
      for (let j = 0; j < n; j++) {
        let s = 0;
        for (let q = 0; q < k; q++) {
          const av = a[ao + (transA ? q * m + i : i * k + q)];
          const bv = b[bo + (transB ? j * k + q : q * n + j)];
          s += av * bv;
        }
        c[z * m * n + i * n + j] = s;
      }
    }
  }
  return c;
}

/** GELU, tanh approximation, and its derivative. */
export function gelu64(x: number): number {
  return 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
}
export function geluGrad64(x: number): number {
  const c = Math.sqrt(2 / Math.PI);
  const t = Math.tanh(c * (x + 0.044715 * x ** 3));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
}

/** Row-wise softmax / log-softmax over the last axis of length `cols`. */
export function softmax64(x: ArrayLike<number>, cols: number, log: boolean): Float64Array {
  const y = new Float64Array(x.length);
  for (let r = 0; r < x.length / cols; r++) {
    let m = -Infinity;
    for (let j = 0; j < cols; j++) m = Math.max(m, x[r * cols + j]);
    let s = 0;
    for (let j = 0; j < cols; j++) s += Math.exp(x[r * cols + j] - m);
    for (let j = 0; j < cols; j++) {
      const v = x[r * cols + j] - m;
      y[r * cols + j] = log ? v - Math.log(s) : Math.exp(v) / s;
    }
  }
  return y;
}

/** Sum over the middle axis of an [outer, axis, inner] view, times `scale`. */
export function reduceSum64(
  x: ArrayLike<number>,
  view: { outer: number; axis: number; inner: number },
  scale = 1,
): Float64Array {
  const { outer, axis, inner } = view;
  const y = new Float64Array(outer * inner);
  for (let o = 0; o < outer; o++) {
    for (let i = 0; i < inner; i++) {
      let s = 0;
      for (let a = 0; a < axis; a++) s += x[(o * axis + a) * inner + i];
      y[o * inner + i] = s * scale;
    }
  }
  return y;
}

/** Max over the middle axis of an [outer, axis, inner] view. */
export function reduceMax64(
  x: ArrayLike<number>,
  view: { outer: number; axis: number; inner: number },
): Float64Array {
  const { outer, axis, inner } = view;
  const y = new Float64Array(outer * inner).fill(-Infinity);
  for (let o = 0; o < outer; o++) {
    for (let a = 0; a < axis; a++) {
      for (let i = 0; i < inner; i++) {
        y[o * inner + i] = Math.max(y[o * inner + i], x[(o * axis + a) * inner + i]);
      }
    }
  }
  return y;
}

/** Dot product in f64. */
export function dot(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}
