/**
 * Fused optimizer kernels: for each parameter tensor the kernel reads the
 * fp32 master, its gradient (f32, f16 or bf16), the fp32 optimizer state and the
 * step signals, and writes the updated master and, when it has one, its
 * working copy. One dispatch takes up to 16 parameter tensors (apex's
 * `multi_tensor_apply`, see `gpu/kernels/multi_tensor.ts`), each over the
 * workgroups it would get alone, so results do not depend on how many share
 * a dispatch. A non-zero `found_inf` makes every kernel return before writing
 * anything, so a skipped step is decided on the GPU.
 *
 * Bindings, in order: per slot k the master `param<k>`, gradient `grad<k>`,
 * the kernel's state buffers and the working copy `copy<k>` (when present);
 * then found_inf (read as u32 bits, so a NaN or -0 flag is handled without
 * float compares), grad_scale and the kernel's shared buffers.
 */
import {
  type Binding,
  defineKernel,
  type DeviceArray,
  type DispatchUniforms,
  type DType,
  type KernelDefinition,
  type LiveUniforms,
  multiTensorDispatches,
  optional,
  SLOT_UNIFORMS,
  slotBindings,
  slotBuffers,
  type SlotField,
  WGSL_GRID_BUILTINS,
  wgslForEachSlot,
} from "../../gpu/kernels/mod.ts";

const WORKGROUP = 256;
const PER_THREAD = 4;
/** Largest finite f16. */
export const F16_MAX = "65504.0";

/**
 * What every update kernel is specialised on: gradient and working-copy
 * dtypes, and how many parameter tensors one dispatch takes.
 */
export type UpdateConfig = { grad: DType; copy: DType | "none"; slots: number };

/** The bindings of an update: per slot master, gradient, `state` and copy; then the shared ones. */
export function updateBindings(
  c: UpdateConfig,
  state: readonly Binding[],
  shared: readonly Binding[] = [],
): Binding[] {
  return [
    ...slotBindings(c.slots, [
      { name: "param", type: "f32", write: true },
      { name: "grad", type: c.grad },
      ...state,
      ...optional(c.copy !== "none", { name: "copy", type: c.copy as DType, write: true }),
    ]),
    { name: "found_inf", type: "u32" },
    { name: "grad_scale", type: "f32" },
    ...shared,
  ];
}

/** Skip test on the flag's bits: any value but ±0 skips (NaN included). */
export const SKIP = "if ((found_inf[0] & 0x7fffffffu) != 0u) { return; }";

/**
 * The element loop of every slot: each pass of the workgroup covers
 * WORKGROUP consecutive elements, so neighbouring threads touch neighbouring
 * addresses. `body(k)` updates `w` (the master) and may read `g` (the scaled
 * gradient) and `i`; its state buffers carry the slot's suffix `k`. With a
 * bf16 working copy each thread updates two neighbouring elements per pass
 * (see {@link pairLoops}).
 */
function elementLoops(c: UpdateConfig, body: (k: number) => string): string {
  if (c.copy === "bf16") return pairLoops(c, body);
  // NOTE: a master beyond the f16 range saturates to ±65504 in its f16 working
  // copy: WGSL leaves the conversion of out-of-range values undefined.
  const write = (k: number) =>
    c.copy === "none"
      ? ""
      : c.copy === "f16"
      ? `\n        st_copy${k}(i, clamp(w, -${F16_MAX}, ${F16_MAX}));`
      : `\n        st_copy${k}(i, w);`;
  return wgslForEachSlot(c.slots, (k) =>
    `for (var e = 0u; e < ${PER_THREAD}u; e++) {
        let i = (wg * ${PER_THREAD}u + e) * ${WORKGROUP}u + lid;
        if (i >= n) { break; }
        var w = param${k}[i];
        var g = ld_grad${k}(i) * scale;
        ${body(k)}
        param${k}[i] = w;${write(k)}
      }`);
}

/**
 * {@link elementLoops} for a bf16 working copy: each thread updates the two
 * elements of one copy word, so it writes the word whole (rounded to
 * nearest-even, as PyTorch; beyond bf16's range ±Inf) instead of two
 * single-half stores with atomics; an odd last element stores its half alone.
 */
function pairLoops(c: UpdateConfig, body: (k: number) => string): string {
  return wgslForEachSlot(c.slots, (k) =>
    `for (var e = 0u; e < ${PER_THREAD}u; e++) {
        let pair = (wg * ${PER_THREAD}u + e) * ${WORKGROUP}u + lid;
        if (2u * pair >= n) { break; }
        var pair_out = vec2<f32>(0.0);
        for (var h = 0u; h < 2u; h++) {
          let i = 2u * pair + h;
          if (i >= n) { break; }
          var w = param${k}[i];
          var g = ld_grad${k}(i) * scale;
          ${body(k)}
          param${k}[i] = w;
          pair_out[h] = w;
        }
        if (2u * pair + 1u < n) { st2_copy${k}(pair, pair_out); } else { st_copy${k}(2u * pair, pair_out.x); }
      }`);
}

/** Elements one workgroup updates: twice as many with a bf16 copy (two per thread and pass). */
function elementsPerWorkgroup(copy: DType | "none"): number {
  return WORKGROUP * PER_THREAD * (copy === "bf16" ? 2 : 1);
}

/** SGD kernel config: momentum and Nesterov change the bindings and the code. */
export type SgdKernelConfig = UpdateConfig & { momentum: boolean; nesterov: boolean };

/** torch.optim.SGD (dampening 0): g += wd·w; v = m·v + g; g = nesterov ? g + m·v : v; w -= lr·g. */
export const sgdKernel = defineKernel({
  name: "fused_sgd",
  bindings: (c: SgdKernelConfig) =>
    updateBindings(c, optional(c.momentum, { name: "velocity", type: "f32", write: true })),
  uniforms: { ...SLOT_UNIFORMS, lr: "f32", wd: "f32", momentum: "f32" },
  source: (c) =>
    `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${SKIP}
  let scale = grad_scale[0];
  let m = p.momentum;
  ${
      elementLoops(c, (k) =>
        `g = g + p.wd * w;${
          c.momentum
            ? `
        let v = m * velocity${k}[i] + g;
        velocity${k}[i] = v;
        ${c.nesterov ? "g = g + m * v;" : "g = v;"}`
            : ""
        }
        w = w - p.lr * g;`)
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
export const ONE_MINUS_POW = `fn one_minus_pow(ln_beta: f32, t: f32) -> f32 {
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
      { name: "exp_avg", type: "f32", write: true },
      { name: "exp_avg_sq", type: "f32", write: true },
    ], [{ name: "step", type: "u32" }]),
  uniforms: {
    ...SLOT_UNIFORMS,
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
      elementLoops(c, (k) =>
        `${c.decoupled ? "w = w * p.decay;" : "g = g + p.wd * w;"}
        let m = p.beta1 * exp_avg${k}[i] + p.one_minus_beta1 * g;
        let v = p.beta2 * exp_avg_sq${k}[i] + p.one_minus_beta2 * g * g;
        exp_avg${k}[i] = m;
        exp_avg_sq${k}[i] = v;
        w = w - step_size * m / (sqrt(v) / bc2_sqrt + p.eps);`)
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

/** One parameter tensor's buffers in an update. */
export interface ParamUpdate {
  /** fp32 master (updated in place). */
  param: DeviceArray;
  /** Its gradient, f32, f16 or bf16, same size. */
  grad: DeviceArray;
  /** Working copy written with the new value, if any. */
  copy?: DeviceArray | undefined;
  /** The optimizer's fp32 state buffers of this parameter, by state name. */
  state: Record<string, DeviceArray>;
}

/** The GPU-resident step signals every update reads. */
export interface UpdateSignals {
  /** f32 [1] skip flag. */
  foundInf: DeviceArray;
  /** f32 [1] gradient multiplier. */
  gradScale: DeviceArray;
}

/**
 * Dispatches `kernel` over `updates`, as many per dispatch as the device
 * allows and only those that agree on gradient and copy dtypes: `config`
 * gives the rest of a dispatch's kernel config, `state` maps each binding
 * name to the state buffer it binds. `hyper` gives the hyper-parameter
 * uniforms from the live group, so a captured step recomputes them at each
 * replay (a scheduled learning rate). `layout` serves kernels that lay
 * elements out otherwise (the compact-state Adam): elements per workgroup,
 * and uniforms of a dispatch's own slots.
 */
export function launchUpdatesInto<C extends UpdateConfig, U extends string>(
  kernel: KernelDefinition<C, string, U>,
  config: Omit<C, keyof UpdateConfig>,
  updates: readonly ParamUpdate[],
  shared: Record<string, DeviceArray>,
  state: Record<string, string>,
  hyper: () => Omit<DispatchUniforms<U>, SlotField>,
  layout: UpdateLayout = {},
): void {
  const work = updates.filter((u) => u.param.size > 0);
  if (work.length === 0) return;
  const uniforms = hyper();
  const gpu = work[0].param.gpu;
  const dispatches = multiTensorDispatches(gpu, work, {
    perTensor: 3 + Object.keys(state).length, // master, gradient, copy (if any), state
    shared: Object.keys(shared).length,
    key: (u) => `${u.grad.dtype}/${u.copy?.dtype ?? "none"}`,
    size: (u) => u.param.size,
    workgroups: (u) =>
      Math.ceil(
        u.param.size / (layout.perWorkgroup ?? elementsPerWorkgroup(u.copy?.dtype ?? "none")),
      ),
  });
  for (const { chunk, table } of dispatches) {
    const own = layout.slotUniforms?.(chunk) ?? {};
    const copy = chunk[0].copy?.dtype ?? "none";
    const full = { ...config, grad: chunk[0].grad.dtype, copy, slots: chunk.length } as C;
    const buffers: Record<string, DeviceArray> = {
      ...slotBuffers("param", chunk.map((u) => u.param)),
      ...slotBuffers("grad", chunk.map((u) => u.grad)),
      ...(copy !== "none" && slotBuffers("copy", chunk.map((u) => u.copy!))),
      ...shared,
    };
    for (const [binding, name] of Object.entries(state)) {
      Object.assign(buffers, slotBuffers(binding, chunk.map((u) => u.state[name])));
    }
    gpu.dispatch(
      gpu.kernel(kernel, full),
      buffers,
      { ...uniforms, ...table.uniforms, ...own } as DispatchUniforms<U>,
      table.grid,
      {},
      hyper as LiveUniforms<U>,
    );
  }
}

/** How a kernel that does not follow {@link elementLoops} lays out its work. */
export interface UpdateLayout {
  /** Elements one workgroup updates (default: {@link elementLoops}' count). */
  perWorkgroup?: number;
  /** Uniforms of one dispatch's slots, from its run of updates (fixed while it is replayed). */
  slotUniforms?: (chunk: readonly ParamUpdate[]) => Record<string, number>;
}

/** Hyper-parameters of one SGD update. */
export interface SgdHyper {
  lr: number;
  weightDecay: number;
  momentum: number;
  nesterov: boolean;
}

/**
 * Fused SGD updates of `updates` (state `momentumBuffer` when momentum > 0),
 * all with the hyper-parameters `h` (the live group: read again at each
 * replay of a captured step).
 */
export function launchSgdUpdatesInto(
  updates: readonly ParamUpdate[],
  signals: UpdateSignals,
  h: SgdHyper,
): void {
  const momentum = h.momentum > 0;
  launchUpdatesInto(
    sgdKernel,
    { momentum, nesterov: momentum && h.nesterov },
    updates,
    { found_inf: signals.foundInf, grad_scale: signals.gradScale },
    momentum ? { velocity: "momentumBuffer" } : {},
    () => ({ lr: h.lr, wd: h.weightDecay, momentum: h.momentum }),
  );
}

/** Hyper-parameters of one Adam update (a group's; they may change between steps). */
export interface AdamHyper {
  lr: number;
  weightDecay: number;
  betas: readonly [number, number];
  eps: number;
}

/** What an Adam update's kernel is specialised on (fixed for an optimizer's life). */
export interface AdamFlags {
  decoupled: boolean;
  biasCorrection: boolean;
}

/** ln β for the bias correction; β = 0 maps to a value whose exp underflows to 0 (βᵗ = 0). */
function lnBeta(beta: number): number {
  return Math.max(Math.log(beta), -1000);
}

/**
 * Fused Adam(W) updates of `updates` (states `expAvg`, `expAvgSq`), all with
 * the hyper-parameters `h` (the live group: read again at each replay of a
 * captured step), reading the step count from `step` (u32 [1]).
 */
export function launchAdamUpdatesInto(
  updates: readonly ParamUpdate[],
  signals: UpdateSignals & { step: DeviceArray },
  h: AdamHyper,
  flags: AdamFlags,
): void {
  launchUpdatesInto(
    adamKernel,
    flags,
    updates,
    { found_inf: signals.foundInf, grad_scale: signals.gradScale, step: signals.step },
    { exp_avg: "expAvg", exp_avg_sq: "expAvgSq" },
    () => adamUniforms(h),
  );
}

/** The uniforms of an Adam update for `h`. */
export function adamUniforms(h: AdamHyper) {
  const [beta1, beta2] = h.betas;
  // Scalars derived from hyper-parameters are computed in f64 here, then rounded once.
  return {
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
}

/** step += 1 on the GPU unless `foundInf` is non-zero. */
export function launchStepCountInto(step: DeviceArray, foundInf: DeviceArray): void {
  const gpu = step.gpu;
  gpu.dispatch(gpu.kernel(stepCountKernel, {}), { found_inf: foundInf, step }, {}, [1]);
}
