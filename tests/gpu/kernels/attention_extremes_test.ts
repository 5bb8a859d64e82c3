/**
 * Fused attention at the inputs that break an online softmax, in every plan
 * (the twelve row plans and the five register tiles) and every dtype,
 * forward and backward, against the f64 reference:
 *
 * - **Wide scores** (head 0): q·k spread over about ±1000 before scaling,
 *   far past exp's range (±88), so every probability but a row's largest
 *   few underflows and exp(s − m) overflows to ∞ unless m is the row's true
 *   maximum. **Rising scores** (head 2): each key beats every earlier one by
 *   more than exp's range, so the thread holding a chunk's or tile's newest
 *   visible key holds the maximum, every thread for some rows. Guards: the
 *   running maximum over each chunk of keys (row plans) and over the TX
 *   threads' partial maxima of a tile row (tiled plans), and the rescale by
 *   exp(m_old − m_new), which underflows to exactly 0 and must wipe the old
 *   sums, not leave them.
 * - **−∞ scores** (the API has no mask argument: a score is −∞ only when
 *   q·k overflows f32, or an input is infinite): in head 1 the first 17 keys
 *   score −∞ against every query and the rest finite. Rows 0..16 see only
 *   −∞ scores: softmax of such a row is NaN (0/0; PyTorch's softmax gives
 *   NaN for an all −∞ row too), and so are their dq and the dk and dv of the
 *   keys they see. Rows from 17 on see a whole chunk (16 keys) and more of −∞
 *   before any finite score. Guards: the running maximum starts at the
 *   lowest finite f32, not −∞ (else exp(−∞ − (−∞)) is NaN and poisons the
 *   finite rows); masked entries are selected away, not multiplied by a 0
 *   mask (0·NaN of a NaN row must not reach the keys it cannot see); the
 *   NaN rows stay in their head.
 * - **Fully dropped rows**: dropout p = 0.9, so many rows keep no weight at
 *   all (row 0, which sees one key, is dropped nine times in ten): their
 *   output and gradients are exactly the reference's 0 contributions, not
 *   0/0 (the configs with dropout: f16 and bf16 row plans, every tile).
 *
 * Kernel configs (dtype, head size, dropout, packed) are the ones the other
 * attention tests compile, so Mesa's shader cache serves them in a full run:
 * f32 row plans at D = 16 without dropout; f16 and bf16 row plans at D = 6
 * with dropout; tiled plans at D = 16 with dropout, f32 or f16 by turns and
 * bf16 packed (every plan in two dtypes, every dtype in some plans).
 */
import assert from "node:assert/strict";
import { type AttentionPlan, type FloatDType, RandomGenerator } from "../../../gpu/mod.ts";
import {
  ATTENTION_PLAN_CANDIDATES,
  TILED_ATTENTION_PLANS,
} from "../../../gpu/kernels/attention/flash_attention.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { dropoutFactor, runAttention, withPlan } from "../../helpers/attention_plans.ts";
import { assertCloseScaled, type Tolerance } from "../../helpers/assert.ts";
import { quantize, uniform } from "../../helpers/reference.ts";
import {
  type AttentionDims,
  causalAttentionWithGrads64,
} from "../../helpers/attention_reference.ts";

const F32_MAX = 3.4028234663852886e38;

/** Keys 0..16 of head 1 score −∞: row 16 is the last that sees nothing else. */
const INF_KEYS = 17;

/**
 * Tolerances relative to each result's largest magnitude (assertCloseScaled):
 * scores of ±250 after scaling carry an f32 rounding of about 250·2⁻²⁴·√D ≈
 * 6e-5, which is the relative error of every probability; f16 and bf16 store
 * the results (half-ulp 4.9e-4 and 2e-3 relative) and the saved output
 * re-enters δ = dO·O in backward.
 */
const TOLERANCE: Record<FloatDType, Tolerance> = {
  f32: { atol: 2e-4, rtol: 2e-4 },
  f16: { atol: 4e-3, rtol: 4e-3 },
  bf16: { atol: 1.6e-2, rtol: 1.6e-2 },
};

/**
 * Inputs of `dims` (three heads; every value is stored in `dtype`):
 *
 * - head 0, wide: q and k uniform in ±a, a chosen so that q·k has a standard
 *   deviation of about 350 (extremes near ±1000);
 * - head 1, with `infinite`: keys 0..16 score −∞ against every query. In f32
 *   and bf16 every q is about +2⁶⁶ and those keys about −2⁶⁶ (each product
 *   overflows f32 to −∞), the other keys about 2⁻⁶⁶ (finite scores of order
 *   1); f16 holds no such values, so there those keys are −∞ and every q
 *   positive. Without `infinite`, wide as head 0;
 * - head 2, rising: q·k = 512·j plus at most ±4·(D − 1), so each query's
 *   newest key beats every earlier one by at least 392 before scaling (98
 *   after it at D = 16: past exp's range): whichever thread holds the newest visible key of a chunk or tile
 *   holds the row's maximum there, every thread for some rows, and each new
 *   chunk rescales the old sums by exactly 0.
 */
function extremeInputs(dims: AttentionDims, dtype: FloatDType, seed: number, infinite: boolean) {
  const { b, t, h, d } = dims, c = h * d, n = b * t * c;
  const a = Math.sqrt((350 * 3) / Math.sqrt(d));
  const [q, k, v, g] = [1, 2, 3, 4].map((s) => uniform(n, seed + 7919 * s, -a, a));
  v.set(uniform(n, seed + 5, -2, 2));
  g.set(uniform(n, seed + 6, -2, 2));
  const huge = dtype === "f16" ? 1 : 2 ** 66;
  for (let row = 0; row < b * t; row++) {
    const i = row % t;
    for (let e = 0; e < d; e++) {
      const at = row * c + e;
      if (infinite) {
        const inf = at + d, u = 1 + q[inf] / (4 * a); // u in (0.75, 1.25)
        q[inf] = huge * u;
        k[inf] = i < INF_KEYS ? (dtype === "f16" ? -Infinity : -huge * u) : k[inf] / (a * huge);
      }
      // 32·16·j exactly (bf16 holds 16·j for j < 256); the rest |q·k| ≤ 2·2·(d − 1).
      const rising = at + 2 * d;
      q[rising] = e === 0 ? 32 : q[rising] * 2 / a;
      k[rising] = e === 0 ? 16 * i : k[rising] * 2 / a;
    }
  }
  const stored = (x: Float64Array) => quantize(x, dtype);
  return { q: stored(q), k: stored(k), v: stored(v), g: stored(g) };
}

/** The elements of head `head` in [B, T, H·D] values. */
function headOf(x: ArrayLike<number>, dims: AttentionDims, head: number): Float64Array {
  const { d } = dims, c = dims.h * d;
  return Float64Array.from(
    { length: dims.b * dims.t * d },
    (_, i) => x[Math.floor(i / d) * c + head * d + (i % d)],
  );
}

/** Rows (of every batch and head) whose every weight dropout drops. */
function droppedRows(factor: (z: number, i: number, j: number) => number, dims: AttentionDims) {
  let rows = 0;
  for (let z = 0; z < dims.b * dims.h; z++) {
    for (let i = 0; i < dims.t; i++) {
      if (Array.from({ length: i + 1 }, (_, j) => factor(z, i, j)).every((f) => f === 0)) rows++;
    }
  }
  return rows;
}

/** One plan's configuration: its dtype, head size, dropout and packing. */
type Config = { dtype: FloatDType; d: number; dropout: boolean; packed: boolean };

/**
 * Runs the three kinds of extreme input through the current plan with `config`:
 * wide scores in head 0 and −∞ scores in head 1 in one call (dropout p = 0.2
 * where the config has it), then, with dropout, p = 0.9 over wide scores.
 */
async function checkExtremes(config: Config, label: string, seed: number): Promise<string[]> {
  const { dtype, d } = config;
  const dims = { b: 1, t: 70, h: 3, d };
  const range = new RandomGenerator(seed).take(dims.b * dims.h * dims.t * dims.t);
  const kernels: string[] = [];
  const calls: { p: number; infinite: boolean }[] = [{
    p: config.dropout ? 0.2 : 0,
    infinite: true,
  }];
  if (config.dropout) calls.push({ p: 0.9, infinite: false });
  for (const { p, infinite } of calls) {
    const x = extremeInputs(dims, dtype, seed, infinite);
    const dropout = p > 0 ? { p, range } : undefined;
    const factor = dropout ? dropoutFactor(p, range, dims.t) : undefined;
    // Scores are computed in f32 by the kernels (and by PyTorch for f32 and bf16 inputs).
    const reference = (magnitudes: boolean) =>
      causalAttentionWithGrads64(x.q, x.k, x.v, x.g, dims, factor, {
        scoreLimit: F32_MAX,
        magnitudes,
      });
    const expected = reference(false), magnitudes = reference(true);
    if (infinite) {
      assert.ok(Number.isNaN(expected.o[dims.d]), "the reference's row 0 of head 1 is NaN");
    }
    if (p === 0.9) assert.ok(droppedRows(factor!, dims) >= 2, "some rows keep no weight at all");
    const run = await runAttention(x, dims, dtype, { packed: config.packed, dropout });
    kernels.push(...run.kernels);
    for (const name of ["o", "dq", "dk", "dv"] as const) {
      // Head by head: the heads' results differ in scale by up to 2¹³².
      for (let head = 0; head < dims.h; head++) {
        const what = `${label} p=${p}${
          infinite ? " (head 1 with -inf keys)" : ""
        }: ${name} head ${head}`;
        const cut = (x: ArrayLike<number>) => headOf(x, dims, head);
        const [actual, wanted, scale] = [run.out, expected, magnitudes].map((r) => cut(r[name]));
        assertCloseScaled(actual, wanted, TOLERANCE[dtype], what, { magnitudes: scale });
      }
    }
  }
  return kernels;
}

const planName = (p: AttentionPlan) =>
  p.tile
    ? `tile ${p.tile.br}x${p.tile.bc} ${p.tile.rm}x${p.tile.rn}`
    : `rows ${p.rows} stage ${p.stage}`;

Deno.test({
  name: "fused attention at extreme scores (±1000 before scaling, −∞ rows, fully dropped rows): " +
    "every row plan, f32, f16 and bf16, forward and backward, matches f64",
  ...GPU_TEST,
  async fn() {
    const configs: Config[] = [
      { dtype: "f32", d: 16, dropout: false, packed: false },
      ...(gpu.f16 ? [{ dtype: "f16", d: 6, dropout: true, packed: false } as const] : []),
      { dtype: "bf16", d: 6, dropout: true, packed: false },
    ];
    for (const [n, plan] of ATTENTION_PLAN_CANDIDATES.entries()) {
      await withPlan(plan, async () => {
        for (const config of configs) {
          const label = `${planName(plan)} ${config.dtype} d=${config.d}`;
          const kernels = await checkExtremes(config, label, 100 + n);
          const flash = kernels.filter((k) => k.startsWith("flash_attention"));
          assert.ok(
            flash.length > 0 && flash.every((k) => k.includes(`rows=${plan.rows},`)),
            label,
          );
        }
      });
    }
  },
});

Deno.test({
  name: "fused attention at extreme scores (±1000 before scaling, −∞ rows, fully dropped rows): " +
    "every register-tiled plan, f32 or f16 by turns and bf16 (packed), forward and backward, " +
    "matches f64",
  ...GPU_TEST,
  async fn() {
    // The tiled test's configs (fused_attention_tiled_test.ts): f32 or f16 by turns, bf16
    // packed. The tiles stage every dtype as f32 and run one softmax whatever it is: the
    // dtype changes the loads and stores only, which the row plans above check in all three.
    const configsOf = (n: number): Config[] => [
      n % 2 === 0 || !gpu.f16
        ? { dtype: "f32", d: 16, dropout: true, packed: false }
        : { dtype: "f16", d: 16, dropout: true, packed: false },
      { dtype: "bf16", d: 16, dropout: true, packed: true },
    ];
    for (const [n, plan] of TILED_ATTENTION_PLANS.entries()) {
      await withPlan(plan, async () => {
        for (const config of configsOf(n)) {
          const label = `${planName(plan)} ${config.dtype}`;
          const kernels = await checkExtremes(config, label, 200 + n);
          const tiled = kernels.filter((k) => k.startsWith("flash_attention_tiled"));
          assert.ok(
            tiled.length > 0 &&
              tiled.length === kernels.filter((k) => k.startsWith("flash")).length,
            label,
          );
        }
      });
    }
  },
});
