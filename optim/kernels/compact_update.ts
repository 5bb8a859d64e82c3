/**
 * Fused Adam(W) with compact moments: `stateDtype: "8bit"` (bitsandbytes'
 * Adam8bit / AdamW8bit: blockwise dynamic quantization) or `"bf16"`
 * (torchao's bf16 states, stochastic rounding). Same update as
 * `adamKernel` (update.ts), in f32; only the storage of m and v differs.
 *
 * Each thread owns one quad of 4 consecutive elements: one u32 word of
 * 8-bit codes per moment (byte e is element 4q + e), or two words of bf16
 * (low half the even element). A workgroup of 256 threads covers 1024
 * elements: 4 blocks of {@link STATE_BLOCK} for the 8-bit absmax scales,
 * whose first thread takes the max of its 64 threads' in workgroup memory
 * (two barriers in all: a CPU adapter pays dearly for each; a tree would
 * take seven). Elements past the tensor's end read as zero and are written
 * as zero bytes, so padding never changes and a state file resumes the
 * same bits.
 *
 * 8bit: m = code₁[byte]·absmax (signed map), v = code₂[byte]·absmax
 * (unsigned map); after the update the new block absmax is max |m| (max v)
 * over the block and each value is stored as the index of the nearest code
 * to value / absmax (ties to the lower index; an all-zero block stores the maps' 0).
 * The update itself uses the f32 m and v before requantization, as
 * bitsandbytes' `kOptimizerStatic8bit2StateBlockwise`.
 *
 * bf16: m and v round to bf16 stochastically: a 16-bit random number is
 * added to the f32 bits before truncation (torchao's `_fp32_to_bf16_sr`),
 * drawn from a hash of the tensor's seed, the step count t and the
 * element, so a resumed run draws the same numbers.
 */
import {
  defineKernel,
  type DeviceArray,
  MAX_TENSOR_SLOTS,
  optional,
  WGSL_GRID_BUILTINS,
  WGSL_RANDOM,
  wgslForEachSlot,
} from "../../gpu/kernels/mod.ts";
import {
  type AdamFlags,
  type AdamHyper,
  adamKernel,
  type AdamKernelConfig,
  adamUniforms,
  F16_MAX,
  launchUpdatesInto,
  ONE_MINUS_POW,
  type ParamUpdate,
  SKIP,
  updateBindings,
  type UpdateSignals,
} from "./update.ts";

/** Elements per 8-bit scale block: bitsandbytes' blockwise optimizers' 256 (BLOCKSIZE_2STATE). */
export const STATE_BLOCK = 256;
const WORKGROUP = 256;
/** Elements per thread (one word of four 8-bit codes). */
const QUAD = 4;
/** Elements one workgroup updates. */
const PER_WORKGROUP = WORKGROUP * QUAD;
const THREADS_PER_BLOCK = STATE_BLOCK / QUAD;
/** A quad's element offsets, for loops written out (constant indices keep the quad in registers). */
const QUADS = [0, 1, 2, 3];

/** How compact moments are stored. */
export type CompactStateDtype = "8bit" | "bf16";

/** The compact Adam kernel's config. */
export type CompactAdamConfig = AdamKernelConfig & { states: CompactStateDtype };

/** Per-slot stochastic-rounding seeds (`seed<k>`), fixed per dispatch. */
const SEED_FIELDS = Array.from({ length: MAX_TENSOR_SLOTS }, (_, k) => `seed${k}`);
const SEED_UNIFORMS = Object.fromEntries(SEED_FIELDS.map((f) => [f, "u32"])) as Record<
  `seed${number}`,
  "u32"
>;

/**
 * The nearest code to `x` (a value / absmax, in [-1, 1]) in the map at `off`
 * of `codes` (0: signed, 256: unsigned), ties to the lower
 * index. The maps' layout gives an index within one of the nearest (the
 * decade from log10 |x|, the midpoint within it), and the two neighbours
 * settle it: three reads instead of a binary search's eight.
 */
const QUANTIZE = `fn quantize(x: f32, off: u32) -> u32 {
  let signed = off == 0u;
  let a = abs(x);
  // Decade i holds |values| in [10^(i-7), 10^(i-6)): u = a / 10^(i-6) is in [0.1, 1).
  let i = clamp(i32(floor(log2(max(a, 1e-30)) * 0.30103)) + 7, 0, 6);
  let u = a / exp2(f32(i - 6) * 3.3219281);
  let count = select(2u << u32(i), 1u << u32(i), signed);
  let j = u32(clamp(round((u - 0.1) / 0.9 * f32(count) - 0.5), 0.0, f32(count - 1u)));
  // Unsigned: 0, then decade i from index 2^(i+1) - 1. Signed: 0 at 127, decade i from 127 + 2^i.
  let pos = select(count - 1u + j, 127u + count + j, signed);
  var c = select(pos, 254u - min(pos, 254u), signed && x < 0.0);
  if (a == 0.0) { c = select(0u, 127u, signed); }
  var best = c;
  for (var k = max(c, 1u) - 1u; k <= min(c + 1u, 255u); k++) {
    if (abs(codes[off + k] - x) < abs(codes[off + best] - x)) { best = k; }
  }
  return best;
}`;

/**
 * A bf16 half of a word as f32, and f32 → bf16 bits rounded stochastically by 16 random bits
 * (dropout's counter-based hash: one stream per tensor seed and step).
 */
const BF16_STATE = `fn state_half(word: u32, half: u32) -> f32 {
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, half == 1u));
}
fn state_bf16(v: f32, r: u32) -> u32 {
  let b = bitcast<u32>(v);
  if ((b & 0x7f800000u) == 0x7f800000u) {
    return (b >> 16u) | select(0u, 0x40u, (b & 0x7fffffu) != 0u);
  }
  return (b + (r & 0xffffu)) >> 16u;
}
${WGSL_RANDOM}`;

/** WGSL that loads quad `q`'s moments of slot `k` into `m_old` / `v_old` (zero past `n`). */
function loadMoments(c: CompactAdamConfig, k: number): string {
  if (c.states === "8bit") {
    return `let cm = exp_avg${k}[q];
        let cv = exp_avg_sq${k}[q];
        let sm = exp_avg_absmax${k}[q / ${THREADS_PER_BLOCK}u];
        let sv = exp_avg_sq_absmax${k}[q / ${THREADS_PER_BLOCK}u];
        ${
      QUADS.map((e) =>
        `m_old[${e}] = codes[(cm >> ${8 * e}u) & 255u] * sm;
        v_old[${e}] = codes[256u + ((cv >> ${8 * e}u) & 255u)] * sv;`
      ).join("\n        ")
    }`;
  }
  return `for (var h = 0u; h < 2u; h++) {
          let wm = exp_avg${k}[2u * q + h];
          let wv = exp_avg_sq${k}[2u * q + h];
          m_old[2u * h] = state_half(wm, 0u);
          m_old[2u * h + 1u] = state_half(wm, 1u);
          v_old[2u * h] = state_half(wv, 0u);
          v_old[2u * h + 1u] = state_half(wv, 1u);
        }`;
}

/** WGSL that stores quad `q`'s new moments `m_new` / `v_new` of slot `k` (8bit: after the absmax reduction). */
function storeMoments(c: CompactAdamConfig, k: number): string {
  if (c.states === "8bit") {
    return `let am = red_m[lid & ~${THREADS_PER_BLOCK - 1}u];
  let av = red_v[lid & ~${THREADS_PER_BLOCK - 1}u];
  if (base < n) {
    var cm = 0u;
    var cv = 0u;
    ${
      QUADS.map((e) =>
        `if (base + ${e}u < n) {
      cm = cm | (quantize(select(0.0, m_new[${e}] / am, am > 0.0), 0u) << ${8 * e}u);
      cv = cv | (quantize(select(0.0, v_new[${e}] / av, av > 0.0), 256u) << ${8 * e}u);
    }`
      ).join("\n    ")
    }
    exp_avg${k}[q] = cm;
    exp_avg_sq${k}[q] = cv;
    if ((lid & ${THREADS_PER_BLOCK - 1}u) == 0u) {
      exp_avg_absmax${k}[q / ${THREADS_PER_BLOCK}u] = am;
      exp_avg_sq_absmax${k}[q / ${THREADS_PER_BLOCK}u] = av;
    }
  }`;
  }
  return `if (base < n) {
    for (var h = 0u; h < 2u; h++) {
      var wm = 0u;
      var wv = 0u;
      for (var j = 0u; j < 2u; j++) {
        let e = 2u * h + j;
        if (base + e < n) {
          // One hash per element: its low 16 bits round m, its high 16 bits v.
          let r = random_u32(p.seed${k} ^ hash_u32(t_bits), base + e);
          wm = wm | (state_bf16(m_new[e], r) << (16u * j));
          wv = wv | (state_bf16(v_new[e], r >> 16u) << (16u * j));
        }
      }
      exp_avg${k}[2u * q + h] = wm;
      exp_avg_sq${k}[2u * q + h] = wv;
    }
  }`;
}

/** WGSL that writes the quad's new masters into the working copy (whole words where it can). */
function storeCopy(c: CompactAdamConfig, k: number): string {
  if (c.copy === "none") return "";
  // As elementLoops: a master beyond the f16 range saturates in its f16 copy.
  const v = (w: string) => c.copy === "f16" ? `clamp(${w}, -${F16_MAX}, ${F16_MAX})` : w;
  return `for (var h = 0u; h < 2u; h++) {
          let i = base + 2u * h;
          if (i + 1u < n) {
            st2_copy${k}(2u * q + h, vec2<f32>(${v("w_new[2u * h]")}, ${v("w_new[2u * h + 1u]")}));
          } else if (i < n) {
            st_copy${k}(i, ${v("w_new[2u * h]")});
          }
        }`;
}

/** The per-slot body: load, update in f32, write master and copy, then requantize. */
function slotBody(c: CompactAdamConfig, k: number): string {
  const wd = c.decoupled ? "w = w * p.decay;" : "g = g + p.wd * w;";
  const reduce = c.states !== "8bit" ? "" : `red_m[lid] = mx_m;
      red_v[lid] = mx_v;
      workgroupBarrier();
      if ((lid & ${THREADS_PER_BLOCK - 1}u) == 0u) {
        for (var s = 1u; s < ${THREADS_PER_BLOCK}u; s++) {
          red_m[lid] = max(red_m[lid], red_m[lid + s]);
          red_v[lid] = max(red_v[lid], red_v[lid + s]);
        }
      }
      workgroupBarrier();`;
  return `let q = wg * ${WORKGROUP}u + lid;
      let base = ${QUAD}u * q;
      var m_old = array<f32, ${QUAD}>(0.0, 0.0, 0.0, 0.0);
      var v_old = array<f32, ${QUAD}>(0.0, 0.0, 0.0, 0.0);
      var m_new = array<f32, ${QUAD}>(0.0, 0.0, 0.0, 0.0);
      var v_new = array<f32, ${QUAD}>(0.0, 0.0, 0.0, 0.0);
      var w_new = array<f32, ${QUAD}>(0.0, 0.0, 0.0, 0.0);
      var mx_m = 0.0;
      var mx_v = 0.0;
      if (base < n) {
        ${loadMoments(c, k)}
        for (var e = 0u; e < ${QUAD}u; e++) {
          let i = base + e;
          if (i >= n) { break; }
          var w = param${k}[i];
          var g = ld_grad${k}(i) * scale;
          ${wd}
          let m = p.beta1 * m_old[e] + p.one_minus_beta1 * g;
          let v = p.beta2 * v_old[e] + p.one_minus_beta2 * g * g;
          w = w - step_size * m / (sqrt(v) / bc2_sqrt + p.eps);
          param${k}[i] = w;
          w_new[e] = w;
          m_new[e] = m;
          v_new[e] = v;
          mx_m = max(mx_m, abs(m));
          mx_v = max(mx_v, v);
        }
        ${storeCopy(c, k)}
      }
      ${reduce}
      ${storeMoments(c, k)}`;
}

/**
 * The compact-state Adam(W) kernel (see the module comment). Bindings: per
 * slot master, gradient, `exp_avg` and `exp_avg_sq` (u32 words), for 8bit
 * `exp_avg_absmax` and `exp_avg_sq_absmax` (f32 per block), the copy; then
 * found_inf, grad_scale, step and, for 8bit, `codes` (the signed map, then
 * the unsigned one: 512 f32).
 */
export const compactAdamKernel = defineKernel({
  name: "fused_adam_compact",
  bindings: (c: CompactAdamConfig) => {
    const eightBit = c.states === "8bit";
    return updateBindings(c, [
      { name: "exp_avg", type: "u32", write: true },
      { name: "exp_avg_sq", type: "u32", write: true },
      ...optional(eightBit, { name: "exp_avg_absmax", type: "f32", write: true }),
      ...optional(eightBit, { name: "exp_avg_sq_absmax", type: "f32", write: true }),
    ], [{ name: "step", type: "u32" }, ...optional(eightBit, { name: "codes", type: "f32" })]);
  },
  uniforms: { ...adamKernel.uniforms, ...SEED_UNIFORMS },
  source: (c) =>
    `${ONE_MINUS_POW}
${
      c.states === "8bit"
        ? `var<workgroup> red_m: array<f32, ${WORKGROUP}>;
var<workgroup> red_v: array<f32, ${WORKGROUP}>;
${QUANTIZE}`
        : BF16_STATE
    }
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${SKIP}
  ${c.states === "8bit" ? "" : ""}
  let scale = grad_scale[0];
  let t_bits = step[0];
  let t = f32(t_bits);
  let bc1 = ${c.biasCorrection ? "one_minus_pow(p.ln_beta1, t)" : "1.0"};
  let bc2 = ${c.biasCorrection ? "one_minus_pow(p.ln_beta2, t)" : "1.0"};
  let step_size = p.lr / bc1;
  let bc2_sqrt = sqrt(bc2);
  ${wgslForEachSlot(c.slots, (k) => slotBody(c, k))}
}`,
});

/** Absmax scales of an 8-bit moment of `n` elements. */
export function stateBlocks(n: number): number {
  return Math.ceil(n / STATE_BLOCK);
}

/**
 * Fused Adam(W) updates with compact moments (states `expAvg`, `expAvgSq`
 * as u32 words, for 8bit also `expAvgAbsmax`, `expAvgSqAbsmax`), as
 * `launchAdamUpdatesInto`. `seeds` gives each parameter's stochastic-rounding
 * seed (bf16); `codes` the two maps (8bit).
 */
export function launchCompactAdamUpdatesInto(
  updates: readonly ParamUpdate[],
  signals: UpdateSignals & { step: DeviceArray; codes?: DeviceArray },
  h: AdamHyper,
  flags: AdamFlags & { states: CompactStateDtype; seeds: ReadonlyMap<DeviceArray, number> },
): void {
  const eightBit = flags.states === "8bit";
  launchUpdatesInto(
    compactAdamKernel,
    { decoupled: flags.decoupled, biasCorrection: flags.biasCorrection, states: flags.states },
    updates,
    {
      found_inf: signals.foundInf,
      grad_scale: signals.gradScale,
      step: signals.step,
      ...(eightBit && { codes: signals.codes! }),
    },
    eightBit
      ? {
        exp_avg: "expAvg",
        exp_avg_sq: "expAvgSq",
        exp_avg_absmax: "expAvgAbsmax",
        exp_avg_sq_absmax: "expAvgSqAbsmax",
      }
      : { exp_avg: "expAvg", exp_avg_sq: "expAvgSq" },
    () => adamUniforms(h),
    {
      perWorkgroup: PER_WORKGROUP,
      slotUniforms: (chunk) =>
        Object.fromEntries(
          SEED_FIELDS.map((f, k) => [f, chunk[k] ? flags.seeds.get(chunk[k].param) ?? 0 : 0]),
        ),
    },
  );
}
