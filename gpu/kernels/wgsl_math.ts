/** WGSL helper functions shared by kernels (all f32 math). */

const GELU_C = "0.7978845608028654"; // sqrt(2 / pi)

/**
 * `safe_tanh` (tanh clamped so it cannot overflow: tanh(±15) is ±1 in f32),
 * `gelu` (tanh form) and `gelu_derivative`.
 */
export const WGSL_MATH = `fn safe_tanh(v: f32) -> f32 { return tanh(clamp(v, -15.0, 15.0)); }
fn gelu(x: f32) -> f32 {
  return 0.5 * x * (1.0 + safe_tanh(${GELU_C} * (x + 0.044715 * x * x * x)));
}
fn gelu_derivative(x: f32) -> f32 {
  let t = safe_tanh(${GELU_C} * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * ${GELU_C} * (1.0 + 3.0 * 0.044715 * x * x);
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
      return `max(${v}, 0.0)`;
    case "gelu":
      return `gelu(${v})`;
  }
}

/** Threads of the workgroups that reduce cooperatively (a power of two). */
export const REDUCE_THREADS = 64;

/** The most negative finite f32: a max-reduction's identity (WGSL may assume no infinities). */
export const WGSL_LOWEST = "-3.4028234663852886e38";

/**
 * Workgroup-wide `reduce_sum(v, lid)` and `reduce_max(v, lid)` over
 * {@link REDUCE_THREADS} threads; every thread gets the result. Call them in
 * uniform control flow (they contain barriers).
 */
export const WGSL_WORKGROUP_REDUCE = `var<workgroup> partial: array<f32, ${REDUCE_THREADS}>;
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
    if (lid < s) { partial[lid] = max(partial[lid], partial[lid + s]); }
    workgroupBarrier();
  }
  let r = partial[0];
  workgroupBarrier();
  return r;
}
`;
