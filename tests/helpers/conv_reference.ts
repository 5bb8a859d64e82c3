/** conv2d from its definition in f64, with its gradients: the reference of the convolution tests. */

/** A convolution case: sizes and PyTorch-style options. */
export interface ConvCase {
  n: number;
  c: number;
  h: number;
  w: number;
  o: number;
  k: [number, number];
  stride?: [number, number];
  padding?: [number, number] | "same";
  dilation?: [number, number];
  groups?: number;
  bias?: boolean;
  relu?: boolean;
}

/**
 * conv2d in f64 from the definition, with its gradients for upstream `dy`:
 * y[n, o, i, j] = b[o] + Σ_{c, u, v} x[n, g·C/G + c, i·s − p + u·d, j·s − p + v·d]·w[o, c, u, v].
 */
export function conv2d64(
  x: Float64Array,
  wt: Float64Array,
  b: Float64Array | null,
  dy: Float64Array | null,
  t: ConvCase,
) {
  const [kh, kw] = t.k, [sh, sw] = t.stride ?? [1, 1], [dh, dw] = t.dilation ?? [1, 1];
  const groups = t.groups ?? 1, cg = t.c / groups, og = t.o / groups;
  const spanH = dh * (kh - 1) + 1, spanW = dw * (kw - 1) + 1;
  const [ph, pw] = t.padding === "same"
    ? [Math.floor((spanH - 1) / 2), Math.floor((spanW - 1) / 2)]
    : t.padding ?? [0, 0];
  const oh = t.padding === "same" ? t.h : Math.floor((t.h + 2 * ph - spanH) / sh) + 1;
  const ow = t.padding === "same" ? t.w : Math.floor((t.w + 2 * pw - spanW) / sw) + 1;
  const y = new Float64Array(t.n * t.o * oh * ow);
  const dx = new Float64Array(x.length), dwt = new Float64Array(wt.length);
  const db = new Float64Array(t.o);
  const X = (n: number, c: number, i: number, j: number) => ((n * t.c + c) * t.h + i) * t.w + j;
  const W = (o: number, c: number, u: number, v: number) => ((o * cg + c) * kh + u) * kw + v;
  for (let n = 0; n < t.n; n++) {
    for (let o = 0; o < t.o; o++) {
      const g = Math.floor(o / og);
      for (let i = 0; i < oh; i++) {
        for (let j = 0; j < ow; j++) {
          const at = ((n * t.o + o) * oh + i) * ow + j;
          let s = b ? b[o] : 0;
          const gy = dy ? dy[at] : 0;
          db[o] += gy;
          for (let c = 0; c < cg; c++) {
            for (let u = 0; u < kh; u++) {
              for (let v = 0; v < kw; v++) {
                const ih = i * sh - ph + u * dh, iw = j * sw - pw + v * dw;
                if (ih < 0 || ih >= t.h || iw < 0 || iw >= t.w) continue;
                const xi = X(n, g * cg + c, ih, iw), wi = W(o, c, u, v);
                s += x[xi] * wt[wi];
                dx[xi] += gy * wt[wi];
                dwt[wi] += gy * x[xi];
              }
            }
          }
          y[at] = s;
        }
      }
    }
  }
  return { y, dx, dw: dwt, db, shape: [t.n, t.o, oh, ow] };
}
