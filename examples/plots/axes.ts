/**
 * The arithmetic of a chart's axes: round tick values that cover the data
 * ({@link niceTicks}, {@link log2Ticks}), their labels, and the maps from
 * values to pixels ({@link linearScale}, {@link log2Scale}). No SVG here.
 *
 * @module
 */

/** A map from a value to a pixel coordinate. */
export type Scale = (value: number) => number;

/**
 * About `target` round ticks (1, 2 or 5 × 10^k apart) whose first and last
 * enclose [lo, hi]; they are the axis's ends, so the axis fits the data.
 * A flat range (lo = hi) is widened around its value. For example
 * niceTicks(2.03, 3.31) is 2, 2.2, 2.4, …, 3.4.
 */
export function niceTicks(lo: number, hi: number, target = 5): number[] {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [0, 1];
  if (hi < lo) [lo, hi] = [hi, lo];
  if (hi === lo) {
    const pad = lo === 0 ? 1 : Math.abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const raw = (hi - lo) / target;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / magnitude;
  const step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
  const first = Math.floor(lo / step + 1e-9), last = Math.ceil(hi / step - 1e-9);
  const ticks: number[] = [];
  // toPrecision drops floating-point dust: 0.30000000000000004 → 0.3
  for (let i = first; i <= last; i++) ticks.push(Number((i * step).toPrecision(12)));
  return ticks;
}

/**
 * The labels of `ticks`, all with the same number of decimals (as many as the
 * spacing needs); 10000 and above in thousands ("12k").
 */
export function tickLabels(ticks: readonly number[]): string[] {
  const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : 1;
  const decimals = Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9)));
  const big = Math.max(...ticks.map(Math.abs)) >= 1e4 && step >= 1000;
  return ticks.map((t) =>
    t === 0 ? "0" : big ? `${Number((t / 1000).toPrecision(6))}k` : t.toFixed(decimals)
  );
}

/**
 * Whole exponents e (ticks at 2^e) strictly enclosing [2^loExp, 2^hiExp], at most
 * about `maxTicks` of them (every 2nd, 4th, … exponent on a wide range),
 * always at least two distinct ones: log2Ticks(16, 16) is 15, 16, 17.
 */
export function log2Ticks(loExp: number, hiExp: number, maxTicks = 6): number[] {
  if (!Number.isFinite(loExp) || !Number.isFinite(hiExp)) return [0, 1];
  // Strictly beyond the data, so that the line never runs along the frame.
  let first = Math.ceil(Math.min(loExp, hiExp)) - 1, last = Math.floor(Math.max(loExp, hiExp)) + 1;
  const stride = Math.max(1, Math.ceil((last - first) / maxTicks));
  first = Math.floor(first / stride) * stride;
  last = Math.ceil(last / stride) * stride;
  const ticks: number[] = [];
  for (let e = first; e <= last; e += stride) ticks.push(e);
  return ticks;
}

/**
 * Maps [lo, hi] linearly onto [from, to] (pixels; `to` < `from` for a y axis
 * that grows upwards).
 */
export function linearScale(lo: number, hi: number, from: number, to: number): Scale {
  const span = hi - lo || 1;
  return (v) => from + ((v - lo) / span) * (to - from);
}

/**
 * Maps values in [2^loExp, 2^hiExp] onto [from, to] by their base-2
 * logarithm: equal ratios are equal distances (2^8 lies halfway between 2^0
 * and 2^16).
 */
export function log2Scale(loExp: number, hiExp: number, from: number, to: number): Scale {
  const linear = linearScale(loExp, hiExp, from, to);
  return (v) => linear(Math.log2(v));
}
