/**
 * The backward pass of a linear layer's GELU input (`linear(x, W, { geluInput })`,
 * whose forward keeps x, not gelu(x)) in one elementwise pass: from x and
 * the gradient the product passes back to gelu(x), it writes gelu(x) (the
 * weight gradient's operand) and, in place of that gradient, the gradient of
 * x = gradient · gelu′(x). The exponential (tanh form) or the normal CDF
 * (exact form) is evaluated once per element, where recomputing gelu(x) and
 * then applying gelu′(x) took two passes and evaluated it twice; the results
 * are those two passes' bit for bit (the same WGSL functions of the same values).
 *
 * Memory: the gradient is overwritten, so the pass holds no tensor beyond
 * gelu(x), as the two passes did.
 */
import type { DType } from "../base/dtype.ts";
import { defineKernel } from "../device/kernel.ts";
import { DeviceArray } from "../device/device_array.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./wgsl/grid.ts";
import { rowElement, type RowWidth } from "./rows/row_width.ts";
import { WGSL_ERF, WGSL_MATH } from "./wgsl/math.ts";

/** The GELU form: `"gelu"` (tanh approximation) or `"gelu_erf"` (exact). */
export type GeluForm = "gelu" | "gelu_erf";

const WORKGROUP = 256;

/** WGSL `gelu_pair(x) -> vec2<f32>`: (gelu(x), gelu′(x)) from one exponential or CDF. */
function wgslGeluPair(form: GeluForm): string {
  return form === "gelu"
    ? `${WGSL_MATH}fn gelu_pair(x: f32) -> vec2<f32> {
  let e = gelu_exp(x);
  return vec2<f32>(gelu_from_exp(x, e), gelu_derivative_from_exp(x, e));
}
`
    : `${WGSL_MATH}${WGSL_ERF}fn gelu_pair(x: f32) -> vec2<f32> {
  let cdf = normal_cdf(x);
  return vec2<f32>(gelu_erf_from_cdf(x, cdf), gelu_erf_derivative_from_cdf(x, cdf));
}
`;
}

/** act = gelu(x); grad ← grad · gelu′(x), per unit of `width` elements. */
export const geluBackwardKernel = defineKernel({
  name: "gelu_backward",
  bindings: (c: { form: GeluForm; dtype: DType; grad: DType; width: RowWidth }) => [
    { name: "x", type: rowElement(c.dtype, c.width) },
    { name: "grad", type: rowElement(c.grad, c.width), write: true },
    { name: "act", type: rowElement(c.dtype, c.width), write: true },
  ],
  uniforms: { units: "u32" },
  source: (c) => {
    const body = c.width === 4
      ? `let xv = ld4_x(i);
  let gv = ld4_grad(i);
  var av = vec4<f32>(0.0);
  var dv = vec4<f32>(0.0);
  for (var k = 0u; k < 4u; k++) {
    let r = gelu_pair(xv[k]);
    av[k] = r.x;
    dv[k] = gv[k] * r.y;
  }
  st4_act(i, av);
  st4_grad(i, dv);`
      : `let r = gelu_pair(ld_x(i));
  let d = ld_grad(i) * r.y;
  st_act(i, r.x);
  st_grad(i, d);`;
    return `${wgslGeluPair(c.form)}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid;
  if (i >= p.units) { return; }
  ${body}
}`;
  },
});

/**
 * gelu(x) (x's dtype, x's shape), and `grad` (the gradient of gelu(x), same
 * size) overwritten with the gradient of x. No autograd.
 */
export function launchGeluBackward(form: GeluForm, x: DeviceArray, grad: DeviceArray): DeviceArray {
  const act = DeviceArray.empty(x.shape, x.dtype, x.gpu);
  if (x.size === 0) return act;
  const width: RowWidth = x.size % 4 === 0 ? 4 : 1;
  const units = x.size / width;
  const kernel = x.gpu.kernel(geluBackwardKernel, {
    form,
    dtype: x.dtype,
    grad: grad.dtype,
    width,
  });
  x.gpu.dispatch(kernel, { x, grad, act }, { units }, grid1d(Math.ceil(units / WORKGROUP)));
  return act;
}
