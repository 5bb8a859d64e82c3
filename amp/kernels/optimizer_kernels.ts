/**
 * Fused optimizer kernels: one dispatch per parameter tensor reads the fp32
 * master, its gradient (f32 or f16), the fp32 optimizer state and the step
 * signals, and writes the updated master and, when it has one, its working
 * copy. A non-zero `found_inf` makes every kernel return before writing
 * anything, so a skipped step is decided on the GPU.
 *
 * Bindings, in order: master, gradient, found_inf (read as u32 bits, so a NaN
 * or -0 flag is handled without float compares), grad_scale, then the
 * kernel's state buffers, then the working copy (when present), then the
 * uniform words.
 */
import type { DType } from "../../gpu/dtype.ts";
import { wgslEnables } from "../../gpu/dtype.ts";
import { type CompiledKernel, defineKernel, f32Bits } from "../../gpu/kernel.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "../../gpu/kernels/grid.ts";
import type { Tensor } from "../../gpu/tensor.ts";

const WORKGROUP = 256;
const PER_THREAD = 4;
/** Largest finite f16. */
const F16_MAX = "65504.0";

/** What every update kernel is specialised on: gradient and working-copy dtypes. */
type UpdateConfig = { grad: DType; copy: DType | "none" };

/** Declares storage bindings 0..n-1 in order, then the uniform `p` at binding n. */
function bindings(
  decls: readonly (readonly [name: string, access: "read" | "read_write", type: string])[],
): string {
  const lines = decls.map(([name, access, type], i) =>
    `@group(0) @binding(${i}) var<storage, ${access}> ${name}: array<${type}>;`
  );
  lines.push(`@group(0) @binding(${decls.length}) var<uniform> p: Params;`);
  return lines.join("\n");
}

function updateBindings(config: UpdateConfig, state: string[]): string {
  return bindings([
    ["param", "read_write", "f32"],
    ["grad", "read", config.grad],
    ["found_inf", "read", "u32"],
    ["grad_scale", "read", "f32"],
    ...state.map((name) => [name, "read_write", name === "step" ? "u32" : "f32"] as const),
    ...(config.copy === "none" ? [] : [["copy", "read_write", config.copy] as const]),
  ]);
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
export const sgdKernel = defineKernel<SgdKernelConfig>({
  name: "fused_sgd",
  wgsl: (c) =>
    `${wgslEnables(c.grad as DType, c.copy === "none" ? "f32" : c.copy)}
struct Params { n: u32, lr: u32, wd: u32, momentum: u32 }
${updateBindings(c, c.momentum ? ["velocity"] : [])}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${SKIP}
  let scale = grad_scale[0];
  let lr = bitcast<f32>(p.lr);
  let wd = bitcast<f32>(p.wd);
  let m = bitcast<f32>(p.momentum);
  ${
      elementLoop(
        `g = g + wd * w;
    ${
          c.momentum
            ? `let v = m * velocity[i] + g;
    velocity[i] = v;
    ${c.nesterov ? "g = g + m * v;" : "g = v;"}`
            : ""
        }
    w = w - lr * g;`,
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
}`;

/**
 * torch.optim.Adam / AdamW: g += wd·w (Adam) or w *= 1 − lr·wd (AdamW);
 * m = β₁m + (1−β₁)g; v = β₂v + (1−β₂)g²; w −= (lr/bc₁)·m / (√v/√bc₂ + ε),
 * with bcᵢ = 1 − βᵢᵗ when bias correction is on (else 1), t read from the
 * optimizer's step counter.
 */
export const adamKernel = defineKernel<AdamKernelConfig>({
  name: "fused_adam",
  wgsl: (c) =>
    `${wgslEnables(c.grad as DType, c.copy === "none" ? "f32" : c.copy)}
struct Params {
  n: u32, lr: u32, wd: u32, decay: u32, beta1: u32, one_minus_beta1: u32,
  beta2: u32, one_minus_beta2: u32, eps: u32, ln_beta1: u32, ln_beta2: u32,
}
${updateBindings(c, ["step", "exp_avg", "exp_avg_sq"])}
${ONE_MINUS_POW}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${SKIP}
  let scale = grad_scale[0];
  let t = f32(step[0]);
  let bc1 = ${c.biasCorrection ? "one_minus_pow(bitcast<f32>(p.ln_beta1), t)" : "1.0"};
  let bc2 = ${c.biasCorrection ? "one_minus_pow(bitcast<f32>(p.ln_beta2), t)" : "1.0"};
  let step_size = bitcast<f32>(p.lr) / bc1;
  let bc2_sqrt = sqrt(bc2);
  let wd = bitcast<f32>(p.wd);
  let decay = bitcast<f32>(p.decay);
  let beta1 = bitcast<f32>(p.beta1);
  let beta2 = bitcast<f32>(p.beta2);
  let omb1 = bitcast<f32>(p.one_minus_beta1);
  let omb2 = bitcast<f32>(p.one_minus_beta2);
  let eps = bitcast<f32>(p.eps);
  ${
      elementLoop(
        `${c.decoupled ? "w = w * decay;" : "g = g + wd * w;"}
    let m = beta1 * exp_avg[i] + omb1 * g;
    let v = beta2 * exp_avg_sq[i] + omb2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    w = w - step_size * m / (sqrt(v) / bc2_sqrt + eps);`,
        c.copy,
      )
    }
}`,
});

/**
 * Advances a u32 [1] step counter unless the step is skipped. It reads its
 * (unused) uniform word because layout "auto" drops unreferenced bindings and
 * every dispatch binds a uniform slice.
 */
export const stepCountKernel = defineKernel<{ kind: "u32" }>({
  name: "optimizer_step_count",
  wgsl: () =>
    `struct Params { unused: u32 }
${bindings([["found_inf", "read", "u32"], ["step", "read_write", "u32"]])}
@compute @workgroup_size(1)
fn main() {
  ${SKIP}
  step[0] = step[0] + 1u + 0u * p.unused;
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

function dispatchUpdate(
  compiled: CompiledKernel,
  b: UpdateBuffers,
  state: readonly Tensor[],
  uniforms: number[],
): void {
  const n = b.param.size;
  if (n === 0) return;
  const gpu = b.param.gpu;
  const buffers = [b.param, b.grad, b.foundInf, b.gradScale, ...state];
  if (b.copy) buffers.push(b.copy);
  gpu.dispatch(
    compiled,
    buffers.map((t) => t.buffer),
    [n, ...uniforms.map(f32Bits)],
    grid1d(Math.ceil(n / (WORKGROUP * PER_THREAD))),
  );
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
  dispatchUpdate(b.param.gpu.kernel(sgdKernel, config), b, velocity ? [velocity] : [], [
    h.lr,
    h.weightDecay,
    h.momentum,
  ]);
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
  const [beta1, beta2] = h.betas;
  // Scalars derived from hyper-parameters are computed in f64 here, then rounded once.
  const compiled = b.param.gpu.kernel(adamKernel, config);
  dispatchUpdate(compiled, b, [state.step, state.expAvg, state.expAvgSq], [
    h.lr,
    h.weightDecay,
    1 - h.lr * h.weightDecay,
    beta1,
    1 - beta1,
    beta2,
    1 - beta2,
    h.eps,
    lnBeta(beta1),
    lnBeta(beta2),
  ]);
}

/** step += 1 on the GPU unless `foundInf` is non-zero. */
export function launchStepCount(step: Tensor, foundInf: Tensor): void {
  const gpu = step.gpu;
  gpu.dispatch(gpu.kernel(stepCountKernel, { kind: "u32" }), [foundInf.buffer, step.buffer], [0], [
    1,
  ]);
}
