/** WGSL helper functions shared by kernels (all f32 math). */

const TWO_GELU_C = "1.5957691216057308"; // 2·sqrt(2 / pi)

/**
 * WGSL test that the f32 expression `v` is NaN, from its bits: WGSL lets
 * implementations assume no NaN, so `v != v`, `max(v, 0.0)` or `v > 0.0`
 * may not see one; a bit test always does.
 */
export function wgslIsNan(v: string): string {
  return `((bitcast<u32>(${v}) & 0x7fffffffu) > 0x7f800000u)`;
}

/**
 * `max_or_nan(a, b)`: the larger, or NaN when either is NaN, as PyTorch's
 * max and amax propagate NaN (a bare `max` may drop it). The larger is chosen
 * by an integer compare of the bits in float order (−0 < +0), never by the
 * float `max`: WGSL lets that flush subnormals to zero, and Dawn's on
 * lavapipe does (`max(-inf, 0x007f8000)` gave 0), while a max only selects.
 */
export const WGSL_MAX_OR_NAN = `fn float_order(x: f32) -> i32 {
  let i = bitcast<i32>(x);
  return select(i, i ^ 0x7fffffff, i < 0);
}
fn max_or_nan(a: f32, b: f32) -> f32 {
  let larger = select(b, a, float_order(a) > float_order(b));
  return select(select(larger, b, ${wgslIsNan("b")}), a, ${wgslIsNan("a")});
}
`;

/**
 * `relu`, `gelu` (tanh form) and `gelu_derivative` (and their `_from_exp`
 * forms, for a kernel that needs both from one exponential); NaN in gives NaN out, as
 * in PyTorch (ReLU must not hide from the loss scaler the NaN it looks for;
 * it tests the sign from the bits, as a float `max` may flush subnormals).
 * The tanh form is written as a sigmoid, 0.5·(1 + tanh u) = 1 / (1 + e^(−2u)),
 * so its left tail does not cancel to a rounding residue; beyond |x| = 10 it
 * has saturated in f32 (GELU is −0 or x there, its derivative 0 or 1), which
 * also keeps x³ from overflowing.
 */
export const WGSL_MATH = `fn is_nan(x: f32) -> bool {
  return ${wgslIsNan("x")};
}
fn relu(x: f32) -> f32 {
  return select(select(0.0, x, bitcast<i32>(x) > 0), x, is_nan(x));
}
fn gelu_exp(x: f32) -> f32 {
  let c = clamp(x, -10.0, 10.0);
  return exp(-${TWO_GELU_C} * (c + 0.044715 * c * c * c));
}
fn gelu_from_exp(x: f32, e: f32) -> f32 {
  return select(select(x / (1.0 + e), -0.0, x < -10.0), x, is_nan(x));
}
fn gelu(x: f32) -> f32 {
  return gelu_from_exp(x, gelu_exp(x));
}
fn gelu_derivative(x: f32) -> f32 {
  return gelu_derivative_from_exp(x, gelu_exp(x));
}
fn gelu_derivative_from_exp(x: f32, e: f32) -> f32 {
  let s = 1.0 / (1.0 + e);
  let c = clamp(x, -10.0, 10.0);
  let d = s + c * ${TWO_GELU_C} * (1.0 + 3.0 * 0.044715 * c * c) * s * (e * s);
  return select(select(select(d, 1.0, x > 10.0), 0.0, x < -10.0), x, is_nan(x));
}
`;

/**
 * `erf_f32(x)`, accurate to a few f32 ulp over the whole line: for |x| < 0.5
 * the odd Taylor series to x¹⁵ (truncation < 2e-10 relative), beyond it
 * 1 − erfc(|x|) with the Chebyshev-fitted erfc of Numerical Recipes (§6.2,
 * fractional error < 1.2e-7), which saturates to ±1 for |x| ≳ 4.
 * `normal_cdf(x)` = Φ(x) takes the left tail from erfc directly, so
 * 1 + erf(x/√2) never cancels: the exact GELU x·Φ(x) keeps its relative
 * accuracy for large negative x, and so does its derivative Φ(x) + x·φ(x).
 */
export const WGSL_ERF = `fn erfc_tail(a: f32) -> f32 {
  let t = 1.0 / (1.0 + 0.5 * a);
  var p = 0.17087277;
  p = -0.82215223 + t * p;
  p = 1.48851587 + t * p;
  p = -1.13520398 + t * p;
  p = 0.27886807 + t * p;
  p = -0.18628806 + t * p;
  p = 0.09678418 + t * p;
  p = 0.37409196 + t * p;
  p = 1.00002368 + t * p;
  p = -1.26551223 + t * p;
  return t * exp(-a * a + p);
}
fn erf_f32(x: f32) -> f32 {
  if (abs(x) < 0.5) {
    let z = x * x;
    var s = -1.0 / 75600.0;
    s = 1.0 / 9360.0 + z * s;
    s = -1.0 / 1320.0 + z * s;
    s = 1.0 / 216.0 + z * s;
    s = -1.0 / 42.0 + z * s;
    s = 1.0 / 10.0 + z * s;
    s = -1.0 / 3.0 + z * s;
    s = 1.0 + z * s;
    return 1.1283791670955126 * x * s;
  }
  return sign(x) * (1.0 - erfc_tail(abs(x)));
}
fn normal_cdf(x: f32) -> f32 {
  let z = x * 0.7071067811865476;
  if (abs(z) < 0.5) { return 0.5 + 0.5 * erf_f32(z); }
  let tail = 0.5 * erfc_tail(abs(z));
  return select(1.0 - tail, tail, z < 0.0);
}
fn gelu_erf(x: f32) -> f32 {
  return gelu_erf_from_cdf(x, normal_cdf(x));
}
fn gelu_erf_from_cdf(x: f32, cdf: f32) -> f32 {
  return x * cdf;
}
fn gelu_erf_derivative(x: f32) -> f32 {
  return gelu_erf_derivative_from_cdf(x, normal_cdf(x));
}
fn gelu_erf_derivative_from_cdf(x: f32, cdf: f32) -> f32 {
  return cdf + x * exp(-0.5 * x * x) * 0.3989422804014327;
}
`;

/** Activations a matmul epilogue can apply. */
export type Activation = "none" | "relu" | "gelu";

/** WGSL expression applying `activation` to the f32 expression `v`. */
export function activationExpr(activation: Activation, v: string): string {
  switch (activation) {
    case "none":
      return v;
    case "relu":
      return `relu(${v})`;
    case "gelu":
      return `gelu(${v})`;
  }
}

/** Threads of the workgroups that reduce cooperatively (a power of two). */
export const REDUCE_THREADS = 64;

/** The most negative finite f32: a max-reduction's identity (WGSL may assume no infinities). */
export const WGSL_LOWEST = "-3.4028234663852886e38";

/**
 * Workgroup-wide `reduce_sum(v, lid)` and `reduce_max(v, lid)` (NaN wins,
 * see {@link WGSL_MAX_OR_NAN}, which it includes) over
 * {@link REDUCE_THREADS} threads; every thread gets the result. Call them in
 * uniform control flow (they contain barriers).
 */
export const WGSL_WORKGROUP_REDUCE =
  `${WGSL_MAX_OR_NAN}var<workgroup> partial: array<f32, ${REDUCE_THREADS}>;
fn reduce_sum(v: f32, lid: u32) -> f32 {
  partial[lid] = v;
  workgroupBarrier();
  for (var s = ${REDUCE_THREADS / 2}u; s > 0u; s >>= 1u) {
    if (lid < s) { partial[lid] += partial[lid + s]; }
    workgroupBarrier();
  }
  let r = partial[0];
  workgroupBarrier();
  return r;
}
fn reduce_max(v: f32, lid: u32) -> f32 {
  partial[lid] = v;
  workgroupBarrier();
  for (var s = ${REDUCE_THREADS / 2}u; s > 0u; s >>= 1u) {
    if (lid < s) { partial[lid] = max_or_nan(partial[lid], partial[lid + s]); }
    workgroupBarrier();
  }
  let r = partial[0];
  workgroupBarrier();
  return r;
}
`;
