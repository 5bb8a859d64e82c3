/**
 * Fused Adam(W) with compact moments: `stateDtype: "8bit"` (bitsandbytes'
 * Adam8bit / AdamW8bit: blockwise dynamic quantization) or `"bf16"`
 * (torchao's bf16 states, stochastic rounding). Same update as
 * `adamKernel` (update.ts), in f32; only the storage of m and v differs.
 *
 * 8bit: each thread owns 16 consecutive elements, four u32 words of codes
 * per moment (byte e of word w is element 4w + e), as bitsandbytes' threads
 * own consecutive elements; a workgroup of 256 threads covers 4096
 * elements, 16 blocks of {@link STATE_BLOCK} for the absmax scales. A
 * block's absmax is the atomic max of its 16 threads' maxima in workgroup
 * memory, one barrier per tensor. (At 4 elements a thread, 64 threads a
 * block and a serial max after two barriers, the 8-bit update cost 2.7x
 * the f32 one on lavapipe, which switches threads at every barrier; the
 * code is written out with constant indices so its arrays stay in
 * registers there.) bf16: 4 elements a thread, two words of two halves
 * (low half the even element). Elements past the tensor's end read as zero
 * and are written as zero bytes, so padding never changes and a state file
 * resumes the same bits.
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
/**
 * Elements per thread: 8bit, four words of four codes per moment (a scale
 * block is 16 threads: a CPU adapter's barriers cost per thread, so fewer
 * threads per element cost less); bf16, two words of two halves.
 */
const PER_THREAD = { "8bit": 16, bf16: 4 } as const;
/** Words of codes per thread and moment (8bit). */
const WORDS = PER_THREAD["8bit"] / 4;
const THREADS_PER_BLOCK = STATE_BLOCK / PER_THREAD["8bit"];
/** Offsets 0 … n − 1, for loops written out (constant indices keep arrays in registers). */
const upTo = (n: number) => Array.from({ length: n }, (_, i) => i);

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
 * The index of the nearest code to `x` (a value / absmax, in [-1, 1]) in
 * the signed or the unsigned map, computed from the maps' layout (see
 * `dynamicCode`) without reading them: the decade by comparisons, the bin
 * within it, and the two places where the nearest code is a neighbour's
 * (a decade's bottom, the top of the last). Equal to a search of the map
 * up to values within a rounding of a midpoint (the tests compare with
 * one). Through log2 / exp2 and reads of the map it cost more than the
 * whole f32 update on lavapipe.
 */
const QUANTIZE = `fn quantize(x: f32, signed: bool) -> u32 {
  let a = abs(x);
  // Decade i holds |values| in [10^(i-7), 10^(i-6)); u = a / 10^(i-6) (exact powers of ten in f32).
  var i = 0u;
  var inv = 1e6;
  if (a >= 1e-6) { i = 1u; inv = 1e5; }
  if (a >= 1e-5) { i = 2u; inv = 1e4; }
  if (a >= 1e-4) { i = 3u; inv = 1e3; }
  if (a >= 1e-3) { i = 4u; inv = 1e2; }
  if (a >= 1e-2) { i = 5u; inv = 1e1; }
  if (a >= 1e-1) { i = 6u; inv = 1.0; }
  let u = a * inv;
  let count = select(2u, 1u, signed) << i;
  let fc = f32(count);
  // 1 / count, exactly (a power of two): multiplies instead of divisions.
  let ifc = bitcast<f32>((127u - i - select(1u, 0u, signed)) << 23u);
  // The decade's codes are the midpoints of count bins of [0.1, 1): the nearest is u's bin,
  let j = u32(clamp(floor((u - 0.1) * fc * 1.1111111), 0.0, fc - 1.0));
  var pos = select(count - 1u, 127u + count, signed) + j;
  // except at the decade's bottom, nearer the previous decade's last code (or 0 below decade 0),
  if (u < select(0.1 + 0.18 * ifc, 0.05 + 0.225 * ifc, i == 0u)) { pos -= 1u; }
  // and at the top of the last decade, nearer 1.
  if (i == 6u && u >= 1.0 - 0.225 * ifc) { pos += 1u; }
  return select(pos, 254u - min(pos, 254u), signed && x < 0.0);
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

/** WGSL that loads thread `q`'s moments of slot `k` into `m_old` / `v_old` (zero past `n`). */
function loadMoments(c: CompactAdamConfig, k: number): string {
  if (c.states === "8bit") {
    return `let sm = exp_avg_absmax${k}[q / ${THREADS_PER_BLOCK}u];
        let sv = exp_avg_sq_absmax${k}[q / ${THREADS_PER_BLOCK}u];
        ${
      upTo(WORDS).map((r) =>
        `if (base + ${4 * r}u < n) {
          let cm = exp_avg${k}[${WORDS}u * q + ${r}u];
          let cv = exp_avg_sq${k}[${WORDS}u * q + ${r}u];
          ${
          upTo(4).map((e) =>
            `m_old[${4 * r + e}] = codes[(cm >> ${8 * e}u) & 255u] * sm;
          v_old[${4 * r + e}] = codes[256u + ((cv >> ${8 * e}u) & 255u)] * sv;`
          ).join("\n          ")
        }
        }`
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

/** WGSL that stores thread `q`'s new moments `m_new` / `v_new` of slot `k` (8bit: after the absmax reduction). */
function storeMoments(c: CompactAdamConfig, k: number): string {
  if (c.states === "8bit") {
    return `let am = bitcast<f32>(atomicLoad(&block_m[lid / ${THREADS_PER_BLOCK}u]));
  let av = bitcast<f32>(atomicLoad(&block_v[lid / ${THREADS_PER_BLOCK}u]));
  ${
      upTo(WORDS).map((r) =>
        `if (base + ${4 * r}u < n) {
    var cm = 0u;
    var cv = 0u;
    ${
          upTo(4).map((e) =>
            `if (base + ${4 * r + e}u < n) {
      cm = cm | (quantize(select(0.0, m_new[${4 * r + e}] / am, am > 0.0), true) << ${8 * e}u);
      cv = cv | (quantize(select(0.0, v_new[${4 * r + e}] / av, av > 0.0), false) << ${8 * e}u);
    }`
          ).join("\n    ")
        }
    exp_avg${k}[${WORDS}u * q + ${r}u] = cm;
    exp_avg_sq${k}[${WORDS}u * q + ${r}u] = cv;
  }`
      ).join("\n  ")
    }
  if (base < n && (lid & ${THREADS_PER_BLOCK - 1}u) == 0u) {
    exp_avg_absmax${k}[q / ${THREADS_PER_BLOCK}u] = am;
    exp_avg_sq_absmax${k}[q / ${THREADS_PER_BLOCK}u] = av;
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

/** WGSL that writes the thread's new masters into the working copy (whole words where it can). */
function storeCopy(c: CompactAdamConfig, k: number): string {
  if (c.copy === "none") return "";
  // As elementLoops: a master beyond the f16 range saturates in its f16 copy.
  const v = (w: string) => c.copy === "f16" ? `clamp(${w}, -${F16_MAX}, ${F16_MAX})` : w;
  return `for (var h = 0u; h < ${PER_THREAD[c.states] / 2}u; h++) {
          let i = base + 2u * h;
          if (i + 1u < n) {
            st2_copy${k}(base / 2u + h, vec2<f32>(${v("w_new[2u * h]")}, ${
    v("w_new[2u * h + 1u]")
  }));
          } else if (i < n) {
            st_copy${k}(i, ${v("w_new[2u * h]")});
          }
        }`;
}

/** The per-slot body: load, update in f32, write master and copy, then requantize. */
function slotBody(c: CompactAdamConfig, k: number): string {
  const wd = c.decoupled ? "w = w * p.decay;" : "g = g + p.wd * w;";
  const per = PER_THREAD[c.states];
  const zeros = `array<f32, ${per}>(${upTo(per).map(() => "0.0").join(", ")})`;
  // 8bit: each block's absmax, as the max of its threads' maxima by u32 bits (the order of
  // non-negative floats; WGSL starts workgroup memory zeroed, and a workgroup updates one tensor).
  const reduce = c.states !== "8bit"
    ? ""
    : `atomicMax(&block_m[lid / ${THREADS_PER_BLOCK}u], bitcast<u32>(mx_m) & 0x7fffffffu);
      atomicMax(&block_v[lid / ${THREADS_PER_BLOCK}u], bitcast<u32>(mx_v) & 0x7fffffffu);
      workgroupBarrier();`;
  return `let q = wg * ${WORKGROUP}u + lid;
      let base = ${per}u * q;
      var m_old = ${zeros};
      var v_old = ${zeros};
      var m_new = ${zeros};
      var v_new = ${zeros};
      var w_new = ${zeros};
      var mx_m = 0.0;
      var mx_v = 0.0;
      if (base < n) {
        ${loadMoments(c, k)}
        ${
    upTo(per).map((e) =>
      `if (base + ${e}u < n) {
          let i = base + ${e}u;
          var w = param${k}[i];
          var g = ld_grad${k}(i) * scale;
          ${wd}
          let m = p.beta1 * m_old[${e}] + p.one_minus_beta1 * g;
          let v = p.beta2 * v_old[${e}] + p.one_minus_beta2 * g * g;
          w = w - step_size * m / (sqrt(v) / bc2_sqrt + p.eps);
          param${k}[i] = w;
          w_new[${e}] = w;
          m_new[${e}] = m;
          v_new[${e}] = v;
          mx_m = max(mx_m, abs(m));
          mx_v = max(mx_v, v);
        }`
    ).join("\n        ")
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
        ? `var<workgroup> block_m: array<atomic<u32>, ${WORKGROUP / THREADS_PER_BLOCK}>;
var<workgroup> block_v: array<atomic<u32>, ${WORKGROUP / THREADS_PER_BLOCK}>;
${QUANTIZE}`
        : BF16_STATE
    }
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${SKIP}
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
      perWorkgroup: WORKGROUP * PER_THREAD[flags.states],
      slotUniforms: (chunk) =>
        Object.fromEntries(
          SEED_FIELDS.map((f, k) => [f, chunk[k] ? flags.seeds.get(chunk[k].param) ?? 0 : 0]),
        ),
    },
  );
}
