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

/** Values as the GPU stores them in `dtype` (f16 / bf16 rounding), back in f64. */
export function quantize(values: ArrayLike<number>, dtype: "f32" | "f16" | "bf16"): Float64Array {
  if (dtype === "bf16") return Float64Array.from(values, roundBf16);
  const q = dtype === "f32" ? Float32Array.from(values) : Float16Array.from(values);
  return Float64Array.from(q);
}

/**
 * `v` rounded to bf16 (8 significant bits) from its f32 rounding, ties to
 * even, written from the definition: drop the low 16 bits of the f32, and
 * round up when they exceed half, or equal it and the kept part is odd.
 */
function roundBf16(v: number): number {
  const f = new Float32Array([v]);
  const bits = new Uint32Array(f.buffer);
  if (Number.isNaN(f[0])) return NaN;
  const low = bits[0] & 0xffff;
  let high = bits[0] >>> 16;
  if (low > 0x8000 || (low === 0x8000 && (high & 1) === 1)) high += 1;
  bits[0] = high << 16;
  return f[0];
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

/**
 * erf in f64: the Maclaurin series below |x| = 2.5 (terms fall below 1e-17
 * before 60), the continued fraction for erfc beyond (converges fast there).
 */
export function erf64(x: number): number {
  const a = Math.abs(x);
  if (a < 2.5) {
    let term = a;
    let sum = a;
    for (let n = 1; n < 80; n++) {
      term *= -a * a / n;
      sum += term / (2 * n + 1);
    }
    return Math.sign(x) * (2 / Math.sqrt(Math.PI)) * sum;
  }
  // erfc(a) = exp(-a²)/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + 2/(a + …))))).
  let f = a;
  for (let k = 60; k >= 1; k--) f = a + (k / 2) / f;
  const erfc = Math.exp(-a * a) / Math.sqrt(Math.PI) / f;
  return Math.sign(x) * (1 - erfc);
}

/** Exact GELU, 0.5·x·(1 + erf(x/√2)), and its derivative Φ(x) + x·φ(x). */
export function geluExact64(x: number): number {
  return 0.5 * x * (1 + erf64(x / Math.SQRT2));
}
export function geluExactGrad64(x: number): number {
  const cdf = 0.5 * (1 + erf64(x / Math.SQRT2));
  return cdf + x * Math.exp(-0.5 * x * x) / Math.sqrt(2 * Math.PI);
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

/**
 * The gradient through row-wise softmax / log-softmax (rows of length `cols`)
 * given its f64 output `y` (from {@link softmax64}) and the upstream gradient
 * `g`: softmax y·(g − Σ g·y), log-softmax g − exp(y)·Σ g.
 */
export function softmaxBackward64(
  y: ArrayLike<number>,
  g: ArrayLike<number>,
  cols: number,
  log: boolean,
): Float64Array {
  const dx = new Float64Array(y.length);
  for (let r = 0; r < y.length / cols; r++) {
    let d = 0;
    for (let j = 0; j < cols; j++) d += g[r * cols + j] * (log ? 1 : y[r * cols + j]);
    for (let j = 0; j < cols; j++) {
      const k = r * cols + j;
      dx[k] = log ? g[k] - Math.exp(y[k]) * d : y[k] * (g[k] - d);
    }
  }
  return dx;
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

/** Options of {@link crossEntropy64}, PyTorch's meaning. */
export interface CrossEntropy64Options {
  smoothing: number;
  weight: ArrayLike<number> | null;
  reduction: "mean" | "sum" | "none";
  ignoreIndex?: number;
}

/**
 * torch.nn.functional.cross_entropy in f64, from its definition: row r with
 * target t loses −(1 − ε)·w_t·log p_t − (ε/C)·Σ_c w_c·log p_c (0 when t is
 * the ignore index); "mean" divides by the kept rows' Σ w_t. `grad` is the
 * gradient of the sum of the returned loss values.
 */
export function crossEntropy64(
  x: ArrayLike<number>,
  targets: number[],
  classes: number,
  o: CrossEntropy64Options,
): { loss: number[]; grad: Float64Array } {
  const logp = softmax64(x, classes, true);
  const w = (c: number) => (o.weight ? o.weight[c] : 1);
  const ignore = o.ignoreIndex ?? -100;
  const losses: number[] = [];
  const grad = new Float64Array(x.length);
  let divisor = 0;
  targets.forEach((t, r) => {
    if (t === ignore) return void losses.push(0);
    divisor += w(t);
    let loss = -(1 - o.smoothing) * w(t) * logp[r * classes + t];
    for (let c = 0; c < classes; c++) {
      loss -= (o.smoothing / classes) * w(c) * logp[r * classes + c];
    }
    losses.push(loss);
    for (let j = 0; j < classes; j++) {
      // d/dx_j of −log p_c is p_j − [j = c].
      const pj = Math.exp(logp[r * classes + j]);
      let g = (1 - o.smoothing) * w(t) * (pj - (j === t ? 1 : 0));
      for (let c = 0; c < classes; c++) {
        g += (o.smoothing / classes) * w(c) * (pj - (j === c ? 1 : 0));
      }
      grad[r * classes + j] = g;
    }
  });
  if (o.reduction === "none") return { loss: losses, grad };
  const total = losses.reduce((a, b) => a + b, 0);
  const scale = o.reduction === "mean" ? 1 / divisor : 1;
  return { loss: [total * scale], grad: grad.map((g) => g * scale) };
}

/** f64 LayerNorm over rows of length `cols` from the definition, and its gradients. */
export function layerNorm64(
  x: Float64Array,
  g: Float64Array,
  cols: number,
  w: Float64Array | null,
  b: Float64Array | null,
  eps: number,
): { y: Float64Array; dx: Float64Array; dw: Float64Array; db: Float64Array } {
  const rows = x.length / cols;
  const y = new Float64Array(x.length), dx = new Float64Array(x.length);
  const dw = new Float64Array(cols), db = new Float64Array(cols);
  for (let r = 0; r < rows; r++) {
    const row = x.subarray(r * cols, (r + 1) * cols), gr = g.subarray(r * cols, (r + 1) * cols);
    const mu = row.reduce((a, v) => a + v, 0) / cols;
    const variance = row.reduce((a, v) => a + (v - mu) ** 2, 0) / cols;
    const rstd = 1 / Math.sqrt(variance + eps);
    const xhat = row.map((v) => (v - mu) * rstd);
    // dL/dx̂_j = g_j·w_j; through x̂ = (x − μ)·rstd the Jacobian is
    // rstd·(δ_ij − 1/C − x̂_i·x̂_j/C), which gives the usual closed form.
    const gx = gr.map((v, j) => v * (w ? w[j] : 1));
    const m1 = gx.reduce((a, v) => a + v, 0) / cols;
    const m2 = gx.reduce((a, v, j) => a + v * xhat[j], 0) / cols;
    for (let j = 0; j < cols; j++) {
      y[r * cols + j] = xhat[j] * (w ? w[j] : 1) + (b ? b[j] : 0);
      dx[r * cols + j] = rstd * (gx[j] - m1 - xhat[j] * m2);
      dw[j] += gr[j] * xhat[j];
      db[j] += gr[j];
    }
  }
  return { y, dx, dw, db };
}
