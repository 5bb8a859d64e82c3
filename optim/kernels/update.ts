/**
 * Fused optimizer kernels: one dispatch per parameter tensor reads the fp32
 * master, its gradient (f32 or f16), the fp32 optimizer state and the step
 * signals, and writes the updated master and, when it has one, its working
 * copy. A non-zero `found_inf` makes every kernel return before writing
 * anything, so a skipped step is decided on the GPU.
 *
 * Bindings, in order: master, gradient, found_inf (read as u32 bits, so a NaN
 * or -0 flag is handled without float compares), grad_scale, then the
 * kernel's state buffers, then the working copy (when present).
 */
import type { DType } from "../../gpu/dtype.ts";
import { type Binding, defineKernel, type DispatchUniforms, optional } from "../../gpu/kernel.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "../../gpu/kernels/grid.ts";
import type { Tensor } from "../../gpu/tensor.ts";

const WORKGROUP = 256;
const PER_THREAD = 4;
/** Largest finite f16. */
const F16_MAX = "65504.0";

/** What every update kernel is specialised on: gradient and working-copy dtypes. */
type UpdateConfig = { grad: DType; copy: DType | "none" };

/** The bindings every update has, around the kernel's own fp32 (or u32 step) state buffers. */
function updateBindings<S extends string>(
  c: UpdateConfig,
  state: readonly Binding<S>[],
): Binding<"param" | "grad" | "found_inf" | "grad_scale" | S | "copy">[] {
  return [
    { name: "param", type: "f32", write: true },
    { name: "grad", type: c.grad },
    { name: "found_inf", type: "u32" },
    { name: "grad_scale", type: "f32" },
    ...state,
    ...optional(c.copy !== "none", { name: "copy", type: c.copy as DType, write: true }),
  ];
}

/** Skip test on the flag's bits: any value but ±0 skips (NaN included). */
const SKIP = "if ((found_inf[0] & 0x7fffffffu) != 0u) { return; }";

/**
 * The element loop: each pass of the workgroup covers WORKGROUP consecutive
 * elements, so neighbouring threads touch neighbouring addresses.
 */
function elementLoop(body: string, copy: UpdateConfig["copy"]): string {
  // NOTE: a master beyond the f16 range saturates to ±65504 in its working
  // copy: WGSL leaves the conversion of out-of-range values undefined.
  const write = copy === "none"
    ? ""
    : copy === "f16"
    ? `copy[i] = f16(clamp(w, -${F16_MAX}, ${F16_MAX}));`
    : "copy[i] = w;";
  return `for (var k = 0u; k < ${PER_THREAD}u; k++) {
    let i = (${WGSL_WORKGROUP_INDEX} * ${PER_THREAD}u + k) * ${WORKGROUP}u + lid;
    if (i >= p.n) { return; }
    var w = param[i];
    var g = f32(grad[i]) * scale;
    ${body}
    param[i] = w;${write && `\n    ${write}`}
  }`;
}

/** SGD kernel config: momentum and Nesterov change the bindings and the code. */
export type SgdKernelConfig = UpdateConfig & { momentum: boolean; nesterov: boolean };

/** torch.optim.SGD (dampening 0): g += wd·w; v = m·v + g; g = nesterov ? g + m·v : v; w -= lr·g. */
export const sgdKernel = defineKernel({
  name: "fused_sgd",
  bindings: (c: SgdKernelConfig) =>
    updateBindings(c, optional(c.momentum, { name: "velocity", type: "f32", write: true })),
  uniforms: { n: "u32", lr: "f32", wd: "f32", momentum: "f32" },
  source: (c) =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${SKIP}
  let scale = grad_scale[0];
  let m = p.momentum;
  ${
      elementLoop(
        `g = g + p.wd * w;
    ${
          c.momentum
            ? `let v = m * velocity[i] + g;
    velocity[i] = v;
    ${c.nesterov ? "g = g + m * v;" : "g = v;"}`
            : ""
        }
    w = w - p.lr * g;`,
        c.copy,
      )
    }
}`,
});

/** Adam kernel config. */
export type AdamKernelConfig = UpdateConfig & { decoupled: boolean; biasCorrection: boolean };

// NOTE: 1 − βᵗ is -expm1(t·ln β) with ln β computed in f64 on the CPU. WGSL
// only promises exp2/log2 (and so pow) an absolute error of 2⁻²¹ near 1,
// which for β₂ = 0.999 would cost 1 − β₂ᵗ about three digits; near zero we
// use expm1's Taylor series (Horner, |x| ≤ 0.5: truncation < 3e-11), exact
// to f32 rounding on any conforming adapter, and 1 − exp(x) elsewhere.
const ONE_MINUS_POW = `fn one_minus_pow(ln_beta: f32, t: f32) -> f32 {
  let x = t * ln_beta;
  if (x < -0.5) { return 1.0 - exp(x); }
  var s = 1.0;
${[10, 9, 8, 7, 6, 5, 4, 3, 2].map((k) => `  s = 1.0 + s * x / ${k}.0;`).join("\n")}
  return -x * s;
}
`;

/**
 * torch.optim.Adam / AdamW: g += wd·w (Adam) or w *= 1 − lr·wd (AdamW);
 * m = β₁m + (1−β₁)g; v = β₂v + (1−β₂)g²; w −= (lr/bc₁)·m / (√v/√bc₂ + ε),
 * with bcᵢ = 1 − βᵢᵗ when bias correction is on (else 1), t read from the
 * optimizer's step counter.
 */
export const adamKernel = defineKernel({
  name: "fused_adam",
  bindings: (c: AdamKernelConfig) =>
    updateBindings(c, [
      { name: "step", type: "u32" },
      { name: "exp_avg", type: "f32", write: true },
      { name: "exp_avg_sq", type: "f32", write: true },
    ]),
  uniforms: {
    n: "u32",
    lr: "f32",
    wd: "f32",
    decay: "f32",
    beta1: "f32",
    one_minus_beta1: "f32",
    beta2: "f32",
    one_minus_beta2: "f32",
    eps: "f32",
    ln_beta1: "f32",
    ln_beta2: "f32",
  },
  source: (c) =>
    `${ONE_MINUS_POW}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${SKIP}
  let scale = grad_scale[0];
  let t = f32(step[0]);
  let bc1 = ${c.biasCorrection ? "one_minus_pow(p.ln_beta1, t)" : "1.0"};
  let bc2 = ${c.biasCorrection ? "one_minus_pow(p.ln_beta2, t)" : "1.0"};
  let step_size = p.lr / bc1;
  let bc2_sqrt = sqrt(bc2);
  ${
      elementLoop(
        `${c.decoupled ? "w = w * p.decay;" : "g = g + p.wd * w;"}
    let m = p.beta1 * exp_avg[i] + p.one_minus_beta1 * g;
    let v = p.beta2 * exp_avg_sq[i] + p.one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    w = w - step_size * m / (sqrt(v) / bc2_sqrt + p.eps);`,
        c.copy,
      )
    }
}`,
});

/** Advances a u32 [1] step counter unless the step is skipped. */
export const stepCountKernel = defineKernel({
  name: "optimizer_step_count",
  bindings: (_: Record<string, never>) => [
    { name: "found_inf", type: "u32" },
    { name: "step", type: "u32", write: true },
  ],
  uniforms: {},
  source: () =>
    `@compute @workgroup_size(1)
fn main() {
  ${SKIP}
  step[0] = step[0] + 1u;
}`,
});

/** Buffers one update reads and writes. */
export interface UpdateBuffers {
  /** fp32 master (updated in place). */
  param: Tensor;
  /** Its gradient, f32 or f16, same size. */
  grad: Tensor;
  /** f32 [1] skip flag. */
  foundInf: Tensor;
  /** f32 [1] gradient multiplier. */
  gradScale: Tensor;
  /** Working copy written with the new value, if any. */
  copy?: Tensor | undefined;
}

/** The grid of one update of `n` elements. */
function updateGrid(n: number): [number, number] {
  return grid1d(Math.ceil(n / (WORKGROUP * PER_THREAD)));
}

/** The buffers every update binds, by name. */
function commonBuffers(b: UpdateBuffers) {
  return {
    param: b.param,
    grad: b.grad,
    found_inf: b.foundInf,
    grad_scale: b.gradScale,
    ...(b.copy && { copy: b.copy }),
  };
}

/** Hyper-parameters of one SGD update. */
export interface SgdHyper {
  lr: number;
  weightDecay: number;
  momentum: number;
  nesterov: boolean;
}

/** One fused SGD update of `b.param`; `velocity` is required when momentum > 0. */
export function launchSgdUpdate(b: UpdateBuffers, velocity: Tensor | null, h: SgdHyper): void {
  const config: SgdKernelConfig = {
    grad: b.grad.dtype,
    copy: b.copy?.dtype ?? "none",
    momentum: velocity !== null,
    nesterov: velocity !== null && h.nesterov,
  };
  const n = b.param.size;
  if (n === 0) return;
  const gpu = b.param.gpu;
  gpu.dispatch(
    gpu.kernel(sgdKernel, config),
    { ...commonBuffers(b), ...(velocity && { velocity }) },
    { n, lr: h.lr, wd: h.weightDecay, momentum: h.momentum },
    updateGrid(n),
  );
}

/** Hyper-parameters of one Adam update. */
export interface AdamHyper {
  lr: number;
  weightDecay: number;
  betas: readonly [number, number];
  eps: number;
  decoupled: boolean;
  biasCorrection: boolean;
}

/** ln β for the bias correction; β = 0 maps to a value whose exp underflows to 0 (βᵗ = 0). */
function lnBeta(beta: number): number {
  return Math.max(Math.log(beta), -1000);
}

/** One fused Adam(W) update of `b.param`, reading the step count from `step` (u32 [1]). */
export function launchAdamUpdate(
  b: UpdateBuffers,
  state: { step: Tensor; expAvg: Tensor; expAvgSq: Tensor },
  h: AdamHyper,
): void {
  const config: AdamKernelConfig = {
    grad: b.grad.dtype,
    copy: b.copy?.dtype ?? "none",
    decoupled: h.decoupled,
    biasCorrection: h.biasCorrection,
  };
  const n = b.param.size;
  if (n === 0) return;
  const [beta1, beta2] = h.betas;
  // Scalars derived from hyper-parameters are computed in f64 here, then rounded once.
  const uniforms: DispatchUniforms<keyof typeof adamKernel.uniforms> = {
    n,
    lr: h.lr,
    wd: h.weightDecay,
    decay: 1 - h.lr * h.weightDecay,
    beta1,
    one_minus_beta1: 1 - beta1,
    beta2,
    one_minus_beta2: 1 - beta2,
    eps: h.eps,
    ln_beta1: lnBeta(beta1),
    ln_beta2: lnBeta(beta2),
  };
  const gpu = b.param.gpu;
  gpu.dispatch(
    gpu.kernel(adamKernel, config),
    { ...commonBuffers(b), step: state.step, exp_avg: state.expAvg, exp_avg_sq: state.expAvgSq },
    uniforms,
    updateGrid(n),
  );
}

/** step += 1 on the GPU unless `foundInf` is non-zero. */
export function launchStepCount(step: Tensor, foundInf: Tensor): void {
  const gpu = step.gpu;
  gpu.dispatch(gpu.kernel(stepCountKernel, {}), { found_inf: foundInf, step }, {}, [1]);
}
