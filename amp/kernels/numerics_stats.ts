/**
 * The numerics inspector's one kernel: it classifies every value of one
 * tensor (non-finite, beyond f16's range, below f16's smallest normal, zero)
 * and adds the counts, and the largest finite |x|, into a row of a GPU
 * statistics buffer with atomics, so nothing is read back per step. Values are
 * classified from bits (WGSL has no `isnan`/`isinf`, and implementations may
 * assume floats are finite), with the tensor bound as `array<u32>` (an f16
 * or bf16 word holds two halves), so the kernel needs no `shader-f16`. A bf16
 * half shifted up is its value's f32 bits, so bf16 is classified as f32.
 *
 * The buffer starts with a header that records the first non-finite tensor
 * ever seen: an atomic min over a sequence number that grows with every
 * watched tensor, in execution order; the one workgroup that lowers it writes
 * the row, step, call and loss scale beside it.
 */
import {
  defineKernel,
  DeviceArray,
  type Gpu,
  grid1d,
  isHalf,
  WGSL_GRID_BUILTINS,
  WGSL_WORKGROUP_INDEX,
} from "../../gpu/kernels/mod.ts";

const WORKGROUP = 256;
const PER_THREAD = 4;

/** Words of the header, and what each holds. */
export const HEADER = { firstSeq: 0, firstRow: 1, firstStep: 2, firstCall: 3, firstScale: 4 };
/** Words before the first row. */
export const HEADER_WORDS = 8;
/** The sequence number (and row) meaning "none". */
export const NONE = 0xffffffff;

/**
 * Words of one row: four 64-bit counts as (low, high) u32 pairs, then the
 * largest finite |x| as f32 bits.
 */
export const ROW = { nonFinite: 0, overflowF16: 2, underflowF16: 4, zeros: 6, amax: 8 };
/** Words per row. */
export const ROW_WORDS = 9;

/** Bits of 65504 (f16's largest finite value) and of 2^-14 (its smallest normal), as f32. */
const F16_MAX_BITS = 0x477fe000;
const F16_MIN_NORMAL_BITS = 0x38800000;

/** The dtypes the statistics kernel reads. */
type StatsDType = "f32" | "f16" | "bf16";

/** Per-thread classification of one value's |bits|, for each dtype (bf16 uses f32's). */
const CLASSIFY = {
  f32: `fn classify(b: u32) {
  let a = b & 0x7fffffffu;
  if ((a & 0x7f800000u) == 0x7f800000u) { non_finite += 1u; return; }
  if (a > ${F16_MAX_BITS}u) { overflow += 1u; }
  if (a == 0u) { zeros += 1u; } else if (a < ${F16_MIN_NORMAL_BITS}u) { underflow += 1u; }
  amax = max(amax, a);
}
fn as_f32_bits(a: u32) -> u32 { return a; }`,
  // A finite f16 never exceeds 65504; subnormals have a zero exponent field.
  // |x| is kept in f16 bits (ordered like the values) and widened once.
  f16: `fn classify(h: u32) {
  let a = h & 0x7fffu;
  if ((a & 0x7c00u) == 0x7c00u) { non_finite += 1u; return; }
  if (a == 0u) { zeros += 1u; } else if (a < 0x0400u) { underflow += 1u; }
  amax = max(amax, a);
}
fn as_f32_bits(a: u32) -> u32 {
  if (a < 0x0400u) { return bitcast<u32>(f32(a) * 5.9604644775390625e-8); } // mantissa · 2^-24
  return (((a >> 10u) + 112u) << 23u) | ((a & 0x3ffu) << 13u);
}`,
} as const;

/** Accumulates one tensor's statistics into a row (and a parameter's row). */
export const numericsStatsKernel = defineKernel({
  name: "numerics_stats",
  bindings: (_: { dtype: StatsDType }) => [
    { name: "x", type: "u32" },
    { name: "scale", type: "f32" },
    { name: "stats", type: "atomic<u32>", write: true },
  ],
  uniforms: { n: "u32", row: "u32", param_row: "u32", seq: "u32", step: "u32", call: "u32" },
  source: ({ dtype }) => {
    const words = dtype === "f32" ? "p.n" : "(p.n + 1u) / 2u";
    // f16, bf16: two halves per word; the high half of the last word is padding when n is odd.
    const [lo, hi] = dtype === "f16"
      ? ["x[w] & 0xffffu", "x[w] >> 16u"]
      : ["x[w] << 16u", "x[w] & 0xffff0000u"];
    const body = dtype === "f32" ? "classify(x[w]);" : `classify(${lo});
        if (2u * w + 1u < p.n) { classify(${hi}); }`;
    return `var<private> non_finite: u32 = 0u;
var<private> overflow: u32 = 0u;
var<private> underflow: u32 = 0u;
var<private> zeros: u32 = 0u;
var<private> amax: u32 = 0u;
var<workgroup> totals: array<atomic<u32>, 5>;
${CLASSIFY[dtype === "bf16" ? "f32" : dtype]}
fn add64(at: u32, v: u32) {
  if (v == 0u) { return; }
  let old = atomicAdd(&stats[at], v);
  if (old + v < old) { atomicAdd(&stats[at + 1u], 1u); } // carry into the high word
}
fn add_row(base: u32, c: array<u32, 5>) {
  add64(base + ${ROW.nonFinite}u, c[0]);
  add64(base + ${ROW.overflowF16}u, c[1]);
  add64(base + ${ROW.underflowF16}u, c[2]);
  add64(base + ${ROW.zeros}u, c[3]);
  atomicMax(&stats[base + ${ROW.amax}u], c[4]);
}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  if (lid < 5u) { atomicStore(&totals[lid], 0u); }
  workgroupBarrier();
  let base = (${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid) * ${PER_THREAD}u;
  for (var k = 0u; k < ${PER_THREAD}u; k++) {
    let w = base + k;
    if (w < ${words}) {
      ${body}
    }
  }
  if (non_finite > 0u) { atomicAdd(&totals[0], non_finite); }
  if (overflow > 0u) { atomicAdd(&totals[1], overflow); }
  if (underflow > 0u) { atomicAdd(&totals[2], underflow); }
  if (zeros > 0u) { atomicAdd(&totals[3], zeros); }
  atomicMax(&totals[4], amax);
  workgroupBarrier();
  if (lid != 0u) { return; }
  let c = array<u32, 5>(atomicLoad(&totals[0]), atomicLoad(&totals[1]), atomicLoad(&totals[2]),
    atomicLoad(&totals[3]), as_f32_bits(atomicLoad(&totals[4])));
  add_row(${HEADER_WORDS}u + p.row * ${ROW_WORDS}u, c);
  if (p.param_row != ${NONE}u) { add_row(${HEADER_WORDS}u + p.param_row * ${ROW_WORDS}u, c); }
  if (c[0] == 0u) { return; }
  // Only the first workgroup of the earliest tensor with a non-finite value lowers the minimum.
  if (atomicMin(&stats[${HEADER.firstSeq}u], p.seq) > p.seq) {
    atomicStore(&stats[${HEADER.firstRow}u], p.row);
    atomicStore(&stats[${HEADER.firstStep}u], p.step);
    atomicStore(&stats[${HEADER.firstCall}u], p.call);
    atomicStore(&stats[${HEADER.firstScale}u], bitcast<u32>(scale[0]));
  }
}`;
  },
});

/** Where one tensor's statistics go, and what identifies it. */
export interface StatsTarget {
  /** Its row. */
  row: number;
  /** A parameter's row it also counts into, or {@link NONE}. */
  paramRow: number;
  /** Its sequence number: grows with every watched tensor, in execution order. */
  seq: number;
  /** The step it belongs to. */
  step: number;
  /** Its call index within the step among tensors of the same row. */
  call: number;
}

/**
 * Dispatches one statistics pass over `x` (f32, f16 or bf16, at least one element)
 * into `stats` (u32 words, bound as i32) at `target`; `scale` is an f32 [1]
 * copied into the header when `x` is the first non-finite tensor. No sync.
 */
export function launchNumericsStatsInto(
  gpu: Gpu,
  x: DeviceArray,
  scale: DeviceArray,
  stats: DeviceArray,
  target: StatsTarget,
): void {
  const dtype = x.dtype as StatsDType;
  const words = isHalf(dtype) ? Math.ceil(x.size / 2) : x.size;
  gpu.dispatch(
    gpu.kernel(numericsStatsKernel, { dtype }),
    { x, scale, stats },
    {
      n: x.size,
      row: target.row,
      param_row: target.paramRow,
      seq: target.seq,
      step: target.step,
      call: target.call,
    },
    grid1d(Math.ceil(words / (WORKGROUP * PER_THREAD))),
  );
}

/**
 * A statistics buffer (u32 words, held as i32) of `rows` rows: `old`'s
 * contents copied in on the GPU (a buffer grows this way), or, without
 * `old`, zero counts and a header that has seen no non-finite value. No sync.
 */
export function statsBuffer(gpu: Gpu, rows: number, old: DeviceArray | null): DeviceArray {
  const words = HEADER_WORDS + rows * ROW_WORDS;
  if (old) {
    const grown = DeviceArray.filled([words], 0, "i32", gpu);
    gpu.batch.copy(old.buffer, grown.buffer, old.size * 4);
    return grown;
  }
  const init = new Uint32Array(words);
  init[HEADER.firstSeq] = NONE;
  init[HEADER.firstRow] = NONE;
  const fresh = DeviceArray.empty([words], "i32", gpu);
  fresh.writeBytes(new Uint8Array(init.buffer));
  return fresh;
}
