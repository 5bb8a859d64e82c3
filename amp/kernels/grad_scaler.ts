/**
 * GradScaler kernels: unscale-and-check (a dispatch per run of up to 16
 * gradient tensors, see `gpu/kernels/multi_tensor.ts`) and
 * the one-thread scale update. WGSL has no `isnan`/`isinf` and may assume
 * floats never overflow, so every check here is on bits: a value is non-finite
 * when its exponent field is all ones (f32 `0x7f800000`, f16 `0x7c00`, bf16
 * `0x7f80`). Gradients are bound as `array<u32>` (an f16 or bf16 word holds
 * two halves), so the kernels need no `shader-f16`.
 */
import {
  BF16_WGSL,
  defineKernel,
  type DeviceArray,
  DTypeError,
  isHalf,
  multiTensorDispatches,
  SLOT_UNIFORMS,
  slotBindings,
  slotBuffers,
  useSubgroups,
  WGSL_GRID_BUILTINS,
  wgslForEachSlot,
} from "../../gpu/kernels/mod.ts";

const WORKGROUP = 256;
const PER_THREAD = 4;
/** Bits of 1.0f: what a kernel stores into found_inf. */
const ONE_BITS = 0x3f800000;

/** The gradient dtypes the unscale kernel takes. */
type GradDType = "f32" | "f16" | "bf16";

// h · inv in bf16 bits, rounded to nearest-even; an input or product that is not finite
// (rounding up past the largest bf16 included) sets bad.
const UNSCALED_BF16 = `${BF16_WGSL}
fn unscaled_bf16(h: u32, inv: f32) -> u32 {
  if ((h & 0x7f80u) == 0x7f80u) { bad = true; return h; }
  let r = bf16_bits(bitcast<f32>(h << 16u) * inv);
  if ((r & 0x7f80u) == 0x7f80u) { bad = true; }
  return r;
}`;

/** Word indices of the scaler's u32 counter tensor (i32 [4]). */
export const COUNTER = { growthTracker: 0, hysteresisLeft: 1, skippedSteps: 2, lastSkipped: 3 };

/** How the update kernel treats the scale: grow/back off, keep it, or set it. */
export const UPDATE_MODE = { dynamic: 0, static: 1, set: 2 } as const;

// 1/s, exact for powers of two (WGSL division may be off by 2.5 ulp).
const WGSL_RECIPROCAL = `fn reciprocal(s: f32) -> f32 {
  let b = bitcast<u32>(s);
  let e = (b >> 23u) & 0xffu;
  if ((b & 0x807fffffu) == 0u && e >= 1u && e <= 253u) { return bitcast<f32>((254u - e) << 23u); }
  return 1.0 / s;
}`;

/**
 * In place g ← g · (1/scale[0]) for each of `slots` gradients (one dispatch,
 * see `multi_tensor.ts`); any non-finite input or product stores 1.0 in
 * found[0]: by each thread that saw one, or with `subgroups` by one thread
 * per subgroup that did (an overflowing step then makes 1/32 of the atomic
 * stores into one word on an NVIDIA GPU).
 */
export const unscaleKernel = defineKernel({
  name: "grad_scaler_unscale",
  // Gradients are bound as u32 words whatever their dtype: no shader-f16 needed.
  // inPlace false: only the check (gradients left scaled, for a fused unscale-and-update later).
  bindings: (c: { dtype: GradDType; slots: number; subgroups: boolean; inPlace?: boolean }) => [
    ...slotBindings(c.slots, [{ name: "grad", type: "u32", write: c.inPlace ?? true }]),
    { name: "scale", type: "f32" },
    { name: "found", type: "atomic<u32>", write: true },
  ],
  uniforms: SLOT_UNIFORMS,
  source: ({ dtype, slots, subgroups, inPlace }) => {
    // f32: one value per word. f16, bf16: two halves per word; the high half of
    // the last word is padding when n is odd and is never tested or changed.
    const exponent = { f32: "0x7f800000u", f16: "0x7c00u", bf16: "0x7f80u" }[dtype];
    const check = (g: string) =>
      dtype === "f32"
        ? `if ((${g}[w] & ${exponent}) == ${exponent}) { bad = true; }`
        : `let b = ${g}[w];
          if ((b & ${exponent}) == ${exponent}) { bad = true; }
          if (2u * w + 1u < n && ((b >> 16u) & ${exponent}) == ${exponent}) { bad = true; }`;
    const body = (g: string) =>
      !(inPlace ?? true)
        ? check(g)
        : dtype === "f32"
        ? `${g}[w] = unscaled_f32(${g}[w], inv);`
        : `let b = ${g}[w];
          let lo = unscaled_${dtype}(b & 0xffffu, inv);
          var hi = b >> 16u;
          if (2u * w + 1u < n) { hi = unscaled_${dtype}(hi, inv); }
          ${g}[w] = lo | (hi << 16u);`;
    return `var<private> bad: bool = false;
${WGSL_RECIPROCAL}
${dtype === "bf16" ? UNSCALED_BF16 : ""}
fn unscaled_f32(b: u32, inv: f32) -> u32 {
  if ((b & 0x7f800000u) == 0x7f800000u) { bad = true; return b; }
  let r = bitcast<u32>(bitcast<f32>(b) * inv);
  if ((r & 0x7f800000u) == 0x7f800000u) { bad = true; }
  return r;
}
fn unscaled_f16(h: u32, inv: f32) -> u32 {
  if ((h & 0x7c00u) == 0x7c00u) { bad = true; return h; }
  let x = unpack2x16float(h).x * inv;
  // |x| > 65504 does not fit f16 (and pack2x16float of it is indeterminate): write ±inf.
  if (abs(x) > 65504.0 || (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u) {
    bad = true;
    return (h & 0x8000u) | 0x7c00u;
  }
  return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let inv = reciprocal(scale[0]);
  ${
      wgslForEachSlot(slots, (k) =>
        `let words = ${dtype === "f32" ? "n" : "(n + 1u) / 2u"};
      let base = (wg * ${WORKGROUP}u + lid) * ${PER_THREAD}u;
      for (var k = 0u; k < ${PER_THREAD}u; k++) {
        let w = base + k;
        if (w < words) {
          ${body(`grad${k}`)}
        }
      }`)
    }
  ${
      // Both subgroup calls before the branch: Tint (Dawn) refuses one on the right of a && in
      // its uniformity analysis, as the short circuit makes it conditional.
      subgroups
        ? `let any_bad = subgroupAny(bad);
  let first = subgroupBroadcastFirst(lid);
  if (any_bad && first == lid) {`
        : "if (bad) {"}
    atomicStore(&found[0], ${ONE_BITS}u);
  }
}`;
  },
});

/**
 * The scale update, one thread. Dynamic rule (PyTorch's `_amp_update_scale_`
 * with DeepSpeed/Megatron hysteresis): on found_inf, growth tracker ← 0 and
 * the hysteresis counter drops by one (not below 0); once it is 0 every
 * overflow backs off, scale ← max(scale · backoff, min). On a clean step the
 * tracker counts up; at the interval it resets, the hysteresis counter is
 * re-armed and scale ← scale · growth when that is finite and ≤ max. Clean
 * steps alone never re-arm the counter (DeepSpeed's default,
 * consecutive_hysteresis = false). Every mode records whether the step was
 * skipped and resets found_inf to 0.
 */
export const scaleUpdateKernel = defineKernel({
  name: "grad_scaler_update",
  bindings: (_: Record<string, never>) => [
    { name: "scale", type: "f32", write: true },
    { name: "found", type: "u32", write: true },
    { name: "counters", type: "u32", write: true },
  ],
  uniforms: {
    mode: "u32",
    stepped: "u32",
    growth: "f32",
    backoff: "f32",
    interval: "u32",
    hysteresis: "u32",
    min_scale: "f32",
    max_scale: "f32",
    new_scale: "f32",
  },
  source: () =>
    `@compute @workgroup_size(1)
fn main() {
  let inf = (found[0] & 0x7fffffffu) != 0u; // any non-zero f32 (NaN included), from bits
  found[0] = 0u;
  if (p.stepped != 0u) {
    counters[${COUNTER.lastSkipped}] = select(0u, 1u, inf);
    if (inf) { counters[${COUNTER.skippedSteps}] += 1u; }
  }
  if (p.mode == ${UPDATE_MODE.set}u) { scale[0] = p.new_scale; return; }
  if (p.mode != ${UPDATE_MODE.dynamic}u || p.stepped == 0u) { return; }
  let s = scale[0];
  if (inf) {
    counters[${COUNTER.growthTracker}] = 0u;
    let left = max(counters[${COUNTER.hysteresisLeft}], 1u) - 1u;
    counters[${COUNTER.hysteresisLeft}] = left;
    if (left == 0u) { scale[0] = max(s * p.backoff, p.min_scale); }
    return;
  }
  let tracker = counters[${COUNTER.growthTracker}] + 1u;
  if (tracker < p.interval) { counters[${COUNTER.growthTracker}] = tracker; return; }
  counters[${COUNTER.growthTracker}] = 0u;
  counters[${COUNTER.hysteresisLeft}] = p.hysteresis;
  let grown = s * p.growth;
  // Never grow to inf: test the product's bits, then the ceiling.
  if ((bitcast<u32>(grown) & 0x7f800000u) != 0x7f800000u && grown <= p.max_scale) {
    scale[0] = grown;
  }
}`,
});

/**
 * Unscales `grads` (f32, f16 or bf16, distinct buffers) in place by 1/`scale`[0]
 * and stores 1.0 in `foundInf`[0] when any element is (or becomes)
 * non-finite: gradients of one dtype share a dispatch, up to the device's
 * slots per dispatch. No sync.
 */
export function launchUnscaleInto(
  grads: readonly DeviceArray[],
  scale: DeviceArray,
  foundInf: DeviceArray,
  options: { inPlace?: boolean } = {},
): void {
  const inPlace = options.inPlace ?? true;
  const bad = grads.find((g) => g.dtype === "i32");
  if (bad) {
    throw new DTypeError(`GradScaler.unscale: gradient ${bad.describe()} is not a float tensor.`);
  }
  const gpu = scale.gpu;
  const dispatches = multiTensorDispatches(gpu, grads.filter((g) => g.size > 0), {
    perTensor: 1,
    shared: 2,
    key: (g) => g.dtype,
    size: (g) => g.size,
    // An f16 or bf16 gradient is read two halves to a u32 word.
    workgroups: (g) => Math.ceil(g.size / (isHalf(g.dtype) ? 2 : 1) / (WORKGROUP * PER_THREAD)),
  });
  for (const { chunk, table } of dispatches) {
    const dtype = chunk[0].dtype as GradDType;
    gpu.dispatch(
      gpu.kernel(unscaleKernel, {
        dtype,
        slots: chunk.length,
        subgroups: useSubgroups(gpu),
        ...(inPlace ? {} : { inPlace }),
      }),
      { ...slotBuffers("grad", chunk), scale, found: foundInf },
      table.uniforms,
      table.grid,
    );
  }
}

/**
 * out[0] = 1 / scale[0] (exact for powers of two), times coef[0] with `coef`:
 * the factor a fused optimizer multiplies gradients that were checked but
 * left scaled (`launchUnscaleInto(..., { inPlace: false })`) by, a clip
 * coefficient folded in. One thread.
 */
export const inverseScaleKernel = defineKernel({
  name: "grad_scaler_inverse",
  bindings: (c: { coef: boolean }) => [
    { name: "scale", type: "f32" },
    ...(c.coef ? [{ name: "coef", type: "f32" as const }] : []),
    { name: "out", type: "f32", write: true },
  ],
  uniforms: {},
  source: ({ coef }) =>
    `${WGSL_RECIPROCAL}
@compute @workgroup_size(1)
fn main() { out[0] = reciprocal(scale[0])${coef ? " * coef[0]" : ""}; }`,
});

/** Writes 1/`scale`[0] (times `coef`[0] when given) into `out`[0]. No sync. */
export function launchInverseScaleInto(
  scale: DeviceArray,
  out: DeviceArray,
  coef?: DeviceArray,
): void {
  const gpu = scale.gpu;
  const kernel = gpu.kernel(inverseScaleKernel, { coef: coef !== undefined });
  gpu.dispatch(kernel, coef ? { scale, coef, out } : { scale, out }, {}, [1]);
}

/** Uniform values of one scale update. */
export interface ScaleUpdateParams {
  /** One of {@link UPDATE_MODE}. */
  mode: number;
  /** Whether an unscale/step ran since the last update (else no bookkeeping). */
  stepped: boolean;
  /** Growth factor (> 1). */
  growth: number;
  /** Backoff factor in (0, 1). */
  backoff: number;
  /** Clean steps between growths. */
  interval: number;
  /** Overflows tolerated before backing off (≥ 1). */
  hysteresis: number;
  /** Floor of the scale. */
  minScale: number;
  /** Ceiling of the scale. */
  maxScale: number;
  /** The scale to set in `set` mode. */
  newScale: number;
}

/**
 * Runs the scale update on `scale`, `foundInf` and `counters` (i32 [4]),
 * with `params()` (called again at each replay of a captured step). No sync.
 */
export function launchScaleUpdateInto(
  state: { scale: DeviceArray; foundInf: DeviceArray; counters: DeviceArray },
  params: () => ScaleUpdateParams,
): void {
  const gpu = state.scale.gpu;
  const uniforms = () => {
    const u = params();
    return {
      mode: u.mode,
      stepped: u.stepped ? 1 : 0,
      growth: u.growth,
      backoff: u.backoff,
      interval: u.interval,
      hysteresis: u.hysteresis,
      min_scale: u.minScale,
      max_scale: u.maxScale,
      new_scale: u.newScale,
    };
  };
  gpu.dispatch(
    gpu.kernel(scaleUpdateKernel, {}),
    { scale: state.scale, found: state.foundInf, counters: state.counters },
    uniforms(),
    [1],
    {},
    uniforms,
  );
}
