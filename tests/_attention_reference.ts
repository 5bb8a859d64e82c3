/**
 * f64 CPU references for the attention ops (causal softmax, permute) and for
 * causal multi-head attention, written from the definitions, never from our
 * WGSL.
 */

/** Causal softmax of scale·x over rows of length t; row r sees columns 0..(r mod t). */
export function causalSoftmax64(x: ArrayLike<number>, t: number, scale = 1): Float64Array {
  const y = new Float64Array(x.length);
  for (let r = 0; r < x.length / t; r++) {
    const visible = (r % t) + 1;
    let m = -Infinity;
    for (let j = 0; j < visible; j++) m = Math.max(m, scale * x[r * t + j]);
    let s = 0;
    for (let j = 0; j < visible; j++) s += Math.exp(scale * x[r * t + j] - m);
    for (let j = 0; j < visible; j++) y[r * t + j] = Math.exp(scale * x[r * t + j] - m) / s;
  }
  return y;
}

/** Gradient of causal softmax from its output y and the upstream gradient g. */
export function causalSoftmaxGrad64(
  y: ArrayLike<number>,
  g: ArrayLike<number>,
  t: number,
  scale = 1,
): Float64Array {
  const dx = new Float64Array(y.length);
  for (let r = 0; r < y.length / t; r++) {
    const visible = (r % t) + 1;
    let d = 0;
    for (let j = 0; j < visible; j++) d += g[r * t + j] * y[r * t + j];
    for (let j = 0; j < visible; j++) {
      dx[r * t + j] = scale * y[r * t + j] * (g[r * t + j] - d);
    }
  }
  return dx;
}

/** Row-major strides of `shape`. */
function strides(shape: readonly number[]): number[] {
  const s = shape.map(() => 1);
  for (let d = shape.length - 2; d >= 0; d--) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

/** `x` (of `shape`) with output axis k taken from input axis order[k], any rank. */
export function permute64(
  x: ArrayLike<number>,
  shape: readonly number[],
  order: readonly number[],
): Float64Array {
  const outShape = order.map((a) => shape[a]);
  const inStrides = strides(shape), outStrides = strides(outShape);
  const y = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) {
    let src = 0;
    for (let k = 0; k < order.length; k++) {
      const c = Math.floor(i / outStrides[k]) % outShape[k];
      src += c * inStrides[order[k]];
    }
    y[i] = x[src];
  }
  return y;
}

/**
 * Causal multi-head attention on q, k, v of shape [b, t, h·d]: per batch and
 * head, softmax(q·kᵀ/√d) with row i seeing keys 0..i, times v; heads
 * concatenated back to [b, t, h·d].
 */
export function causalAttention64(
  q: ArrayLike<number>,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  dims: { b: number; t: number; h: number; d: number },
): Float64Array {
  const { b, t, h, d } = dims, c = h * d;
  const out = new Float64Array(b * t * c);
  const at = (z: number, i: number, head: number, e: number) => (z * t + i) * c + head * d + e;
  for (let z = 0; z < b; z++) {
    for (let head = 0; head < h; head++) {
      for (let i = 0; i < t; i++) {
        const scores = new Float64Array(i + 1);
        let m = -Infinity;
        for (let j = 0; j <= i; j++) {
          let s = 0;
          for (let e = 0; e < d; e++) s += q[at(z, i, head, e)] * k[at(z, j, head, e)];
          scores[j] = s / Math.sqrt(d);
          m = Math.max(m, scores[j]);
        }
        let total = 0;
        for (let j = 0; j <= i; j++) total += scores[j] = Math.exp(scores[j] - m);
        for (let e = 0; e < d; e++) {
          let o = 0;
          for (let j = 0; j <= i; j++) o += (scores[j] / total) * v[at(z, j, head, e)];
          out[at(z, i, head, e)] = o;
        }
      }
    }
  }
  return out;
}
