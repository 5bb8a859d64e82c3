/**
 * The fused attention's backward on subgroup matrices (dq, then dk and dv,
 * gpu/kernels/attention/flash_attention_subgroup_matrix_backward.ts), forced
 * with the subgroup-matrix forward, against f64: T = 1, 7, 33, 70 and 256
 * (one block, edge blocks, rows past T, several key blocks), head sizes 8
 * and 64, B·H > 1, packed q/k/v, dropout (the same mask as every plan) and
 * scores of ±1000 before scaling. Then the second backward shape the tuner
 * is offered, and the fallbacks (f32, bf16, a head size the config does not
 * divide) that run the SIMT backward.
 *
 * They need an adapter with an f16→f32 subgroup-matrix config: the Dawn
 * backend (Mesa 26's lavapipe, 8×8×8, which compiles each such kernel in
 * seconds, so the cases share few kernel configs). Elsewhere they are
 * ignored, saying so in their names; that the kernels compile for every
 * adapter's shapes is tests/null_backend_compile_test.ts's.
 */
import assert from "node:assert/strict";
import { type AttentionPlan, type FloatDType, RandomGenerator } from "../gpu/mod.ts";
import { DEFAULT_ATTENTION_PLAN } from "../gpu/kernels/attention/plans.ts";
import { attentionMatrixFor } from "../gpu/kernels/attention/flash_attention_subgroup_matrix.ts";
import { matrixBackwardsFor } from "../gpu/kernels/attention/flash_attention_subgroup_matrix_backward.ts";
import { f16MatrixConfig } from "../gpu/device/subgroup_matrix_configs.ts";
import { gpu, GPU_TEST } from "./_gpu.ts";
import { dropoutFactor, runAttention, withPlan } from "./_attention_plans.ts";
import { assertClose, type Tolerance } from "./_assert.ts";
import { quantize, uniform } from "./_reference.ts";
import { type AttentionDims, causalAttentionWithGrads64 } from "./_attention_reference.ts";

const config = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);
/** Appended to each test's name where it cannot run. */
const CANNOT_RUN = config ? "" : " (IGNORED: this adapter has no f16→f32 subgroup-matrix " +
  "config; run on the Dawn backend, HALFSTEP_BACKEND=dawn)";
const DAWN_TEST = { ...GPU_TEST, ignore: !config } as const;

/** The forward and the `which`-th backward on subgroup matrices, at head size D. */
function matrixPlan(headSize: number, which = 0): AttentionPlan {
  const matrix = attentionMatrixFor(gpu, headSize, "f16");
  const matrixBackward = matrixBackwardsFor(gpu, headSize, "f16")[which];
  assert.ok(
    matrix && matrixBackward,
    `the device offers subgroup-matrix attention at D = ${headSize}`,
  );
  return { ...DEFAULT_ATTENTION_PLAN, matrix, matrixBackward };
}

/**
 * The forward's tolerances (tests/attention_subgroup_matrix_test.ts, whose
 * backward is SIMT) hold for this backward too, with one more rounding: dS
 * and W = P·keep go to f16 for their products (half-ulp 2⁻¹¹ relative, as
 * FlashAttention on tensor cores), so dq = scale·Σ dS·K and dk = scale·Σ
 * dS·Q carry up to 2⁻¹¹·Σ|dS|·|k| where Σ dS cancels to 0: with |q|, |k|,
 * |v|, |dO| ≤ 2 and D = 64, Σ|dS| stays under 8 and scale·8·2·2⁻¹¹ ≈ 1e-3,
 * inside 4e-3. With scores of ±1000 (|q|, |k| ≤ 32) the gradients reach 9
 * (f16 half-ulp 3.9e-3 there) and the f16 dS rounds terms of |k| ≤ 32:
 * atol 4 of those half-ulps.
 */
const TOL: Tolerance = { atol: 4e-3, rtol: 4e-3 };
const TOL_LARGE: Tolerance = { atol: 1.6e-2, rtol: 4e-3 };
/** The fallbacks' (the SIMT plans' f32 and bf16 tolerances, fused_attention_tiled_test.ts). */
const TOL_SIMT: Partial<Record<FloatDType, Tolerance>> = {
  f32: { atol: 2e-5, rtol: 2e-4 },
  bf16: { atol: 1.6e-2, rtol: 1.6e-2 },
};

interface Case {
  dims: AttentionDims;
  /** Bound of |q| and |k| (|v| and |dO| stay 2): 32 makes scores of ±1000 at D = 8. */
  range?: number;
  dropout?: boolean;
  packed?: boolean;
}

/** o, dq, dk, dv of `c` with the forced plan, against f64, and the kernels dispatched. */
async function check(c: Case, seed: number, dtype: FloatDType = "f16"): Promise<string[]> {
  const { dims } = c, n = dims.b * dims.t * dims.h * dims.d, r = c.range ?? 2;
  const [q, k] = [1, 2].map((s) => quantize(uniform(n, seed + s, -r, r), dtype));
  const [v, g] = [3, 4].map((s) => quantize(uniform(n, seed + s, -2, 2), dtype));
  const range = new RandomGenerator(seed).take(dims.b * dims.h * dims.t * dims.t);
  const dropout = c.dropout ? { p: 0.25, range } : undefined;
  const factor = dropout && dropoutFactor(dropout.p, range, dims.t);
  const expected = causalAttentionWithGrads64(q, k, v, g, dims, factor);
  const { out, kernels } = await runAttention({ q, k, v, g }, dims, dtype, {
    packed: c.packed,
    dropout,
  });
  const tol = TOL_SIMT[dtype] ?? (r > 2 ? TOL_LARGE : TOL);
  for (const name of ["o", "dq", "dk", "dv"] as const) {
    assertClose(out[name], expected[name], tol, `${JSON.stringify(c)} ${dtype} ${name}`);
  }
  return kernels;
}

/** The kernel families of a run: the forward, dq and dk/dv. */
const families = (kernels: string[]) => kernels.map((k) => k.split(/[^a-z_]/)[0]);

/** Forward and backward ran on subgroup matrices. */
function assertAllMatrices(kernels: string[], label: string) {
  assert.deepEqual(families(kernels), [
    "flash_attention_subgroup_matrix_forward",
    "flash_attention_subgroup_matrix_dq",
    "flash_attention_subgroup_matrix_dkv",
  ], label);
}

Deno.test({
  name: "subgroup-matrix attention backward: dq, dk, dv match f64 at T = 1, 7, 33, 70, 256, " +
    "D = 8 and 64, B·H > 1, packed" + CANNOT_RUN,
  ...DAWN_TEST,
  async fn() {
    for (const d of [8, 64]) {
      await withPlan(matrixPlan(d), async () => {
        for (const [n, t] of [1, 7, 33, 70, 256].entries()) {
          const c: Case = { dims: { b: 2, t, h: d === 8 ? 3 : 2, d }, packed: n % 2 === 1 };
          if (t === 256) c.dims.b = 1;
          assertAllMatrices(await check(c, 100 * d + t), JSON.stringify(c));
        }
      });
    }
  },
});

Deno.test({
  name: "subgroup-matrix attention backward: scores of ±1000 before scaling, and dropout (the " +
    "same mask as every plan), match f64" + CANNOT_RUN,
  ...DAWN_TEST,
  async fn() {
    await withPlan(matrixPlan(8), async () => {
      // Over several blocks (T = 70), so the scores move by hundreds between them.
      for (const [n, t] of [7, 70].entries()) {
        const c: Case = { dims: { b: 1, t, h: 2, d: 8 }, range: 32, packed: n === 1 };
        assertAllMatrices(await check(c, 500 + t), JSON.stringify(c));
      }
      for (const [n, t] of [33, 70].entries()) {
        const c: Case = { dims: { b: 2, t, h: 2, d: 8 }, dropout: true, packed: n === 1 };
        assertAllMatrices(await check(c, 600 + t), JSON.stringify(c));
      }
    });
  },
});

Deno.test({
  name: "subgroup-matrix attention backward: the second shape offered to the tuner matches f64, " +
    "and f32, bf16 and a head size the config does not divide run the SIMT backward" + CANNOT_RUN,
  ...DAWN_TEST,
  async fn() {
    const offered = matrixBackwardsFor(gpu, 8, "f16");
    assert.ok(offered.length >= 2, `two backward shapes at D = 8 (${offered.length})`);
    await withPlan(matrixPlan(8, 1), async () => {
      const c: Case = { dims: { b: 2, t: 70, h: 2, d: 8 }, dropout: true, packed: true };
      assertAllMatrices(await check(c, 800), JSON.stringify(c));
    });
    await withPlan(matrixPlan(8), async () => {
      const cases: [FloatDType, number][] = [["f32", 8], ["bf16", 8], ["f16", 12]];
      for (const [dtype, d] of cases) {
        const kernels = families(await check({ dims: { b: 1, t: 33, h: 2, d } }, 900 + d, dtype));
        assert.deepEqual(
          kernels,
          ["flash_attention_forward", "flash_attention_dq", "flash_attention_dkv"],
          `${dtype} D = ${d}`,
        );
      }
    });
  },
});
