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

/** Dims of a multi-head attention reference call. */
export interface AttentionDims {
  b: number;
  t: number;
  h: number;
  d: number;
}

/**
 * Causal multi-head attention on [b, t, h·d] inputs with a weight factor per
 * (batch·head z, query i, key j) applied after the softmax (dropout: 0 or
 * 1/(1 − p); 1 without), and the gradients of q, k and v for upstream `g`,
 * from the softmax's Jacobian (no shortcut of the fused kernels):
 * o_i = Σ_j f_ij·p_ij·v_j; dv_j = Σ_i f_ij·p_ij·g_i; dp_ij = f_ij·g_i·v_j;
 * ds_ij = p_ij·(dp_ij − Σ_j' p_ij'·dp_ij'); dq_i = Σ_j ds_ij·k_j/√d;
 * dk_j = Σ_i ds_ij·q_i/√d.
 *
 * Options: `scoreLimit` makes a score past it ±∞ (the largest finite f32
 * for kernels that compute scores in f32), so a row whose every score is −∞
 * gives NaN, as softmax of such a row does in PyTorch; softmax subtracts the
 * row's maximum in f64, so scores of any finite size stay finite here.
 * `magnitudes` returns instead each result evaluated on the magnitudes of its
 * terms (|v|, |g|, |k|, |q|, and |dp_ij| + |Σ p·dp| for the difference): the
 * scale of the rounding error a float evaluation may make, which the result
 * itself can be far below where the difference cancels (one-hot rows).
 */
export function causalAttentionWithGrads64(
  q: ArrayLike<number>,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  g: ArrayLike<number>,
  dims: AttentionDims,
  factor: (z: number, i: number, j: number) => number = () => 1,
  options: { scoreLimit?: number; magnitudes?: boolean } = {},
): { o: Float64Array; dq: Float64Array; dk: Float64Array; dv: Float64Array } {
  const { b, t, h, d } = dims, c = h * d, n = b * t * c, scale = 1 / Math.sqrt(d);
  const { scoreLimit = Infinity, magnitudes = false } = options;
  // A score past `scoreLimit` is ±∞, as it is when computed in a narrower float.
  const limited = (s: number) => Math.abs(s) > scoreLimit ? Math.sign(s) * Infinity : s;
  const term = magnitudes ? Math.abs : (x: number) => x;
  const [o, dq, dk, dv] = [0, 1, 2, 3].map(() => new Float64Array(n));
  const at = (z: number, i: number, e: number) => (Math.floor(z / h) * t + i) * c + (z % h) * d + e;
  const rowDot = (x: ArrayLike<number>, i: number, y: ArrayLike<number>, j: number, z: number) => {
    let s = 0;
    for (let e = 0; e < d; e++) s += x[at(z, i, e)] * y[at(z, j, e)];
    return s;
  };
  const termDot = (x: ArrayLike<number>, i: number, y: ArrayLike<number>, j: number, z: number) => {
    let s = 0;
    for (let e = 0; e < d; e++) s += term(x[at(z, i, e)]) * term(y[at(z, j, e)]);
    return s;
  };
  for (let z = 0; z < b * h; z++) {
    for (let i = 0; i < t; i++) {
      const p = new Float64Array(i + 1), dp = new Float64Array(i + 1);
      let m = -Infinity;
      for (let j = 0; j <= i; j++) m = Math.max(m, p[j] = limited(scale * rowDot(q, i, k, j, z)));
      let total = 0;
      for (let j = 0; j <= i; j++) total += p[j] = Math.exp(p[j] - m);
      let pdp = 0;
      for (let j = 0; j <= i; j++) {
        p[j] /= total;
        const f = factor(z, i, j);
        for (let e = 0; e < d; e++) {
          o[at(z, i, e)] += f * p[j] * term(v[at(z, j, e)]);
          dv[at(z, j, e)] += f * p[j] * term(g[at(z, i, e)]);
        }
        dp[j] = f * termDot(g, i, v, j, z);
        pdp += p[j] * dp[j];
      }
      for (let j = 0; j <= i; j++) {
        const ds = p[j] * (magnitudes ? dp[j] + pdp : dp[j] - pdp) * scale;
        for (let e = 0; e < d; e++) {
          dq[at(z, i, e)] += ds * term(k[at(z, j, e)]);
          dk[at(z, j, e)] += ds * term(q[at(z, i, e)]);
        }
      }
    }
  }
  return { o, dq, dk, dv };
}
