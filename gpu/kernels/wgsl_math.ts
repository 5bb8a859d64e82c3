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
