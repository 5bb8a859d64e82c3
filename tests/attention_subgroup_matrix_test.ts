/**
 * The fused attention's subgroup-matrix (tensor-core) forward, forced,
 * against f64: output and, through the row plan's backward kernels (which
 * read its log-sum-exp), dq, dk and dv, at odd T (edge blocks, rows past T,
 * one block and several), two head sizes, B·H > 1, packed q/k/v, dropout
 * (the same mask as every plan), and scores far beyond exp's range. Then
 * its fallbacks: f32, bf16 and a head size the config does not divide run
 * the SIMT forward.
 *
 * Those need an adapter with an f16→f32 subgroup-matrix config: the Dawn
 * backend (Mesa 26's lavapipe lists 8×8×8, and compiles each such kernel in
 * seconds, so the cases share few kernel configs). Elsewhere they are
 * ignored, saying so in their names; how the plan joins the attention plans
 * (candidates, tuners, initGpu) is tested on every backend by
 * tests/attention_plans_subgroup_matrix_test.ts.
 */
import assert from "node:assert/strict";
import { type AttentionPlan, type FloatDType, RandomGenerator } from "../gpu/mod.ts";
import { DEFAULT_ATTENTION_PLAN } from "../gpu/kernels/attention/plans.ts";
import { attentionMatrixFor } from "../gpu/kernels/attention/flash_attention_subgroup_matrix.ts";
import { f16MatrixConfig } from "../gpu/device/subgroup_matrix_configs.ts";
import { gpu, GPU_TEST } from "./_gpu.ts";
import { dropoutFactor, runAttention, withPlan } from "./_attention_plans.ts";
import { assertClose, type Tolerance } from "./_assert.ts";
import { quantize, uniform } from "./_reference.ts";
import { type AttentionDims, causalAttentionWithGrads64 } from "./_attention_reference.ts";
import { requireMatricesOnDawn } from "./_dawn_pass.ts";

const config = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);
/** Appended to each test's name where it cannot run. */
const CANNOT_RUN = config ? "" : " (IGNORED: this adapter has no f16→f32 subgroup-matrix " +
  "config; run on the Dawn backend, HALFSTEP_BACKEND=dawn)";
const DAWN_TEST = { ...GPU_TEST, ignore: !config } as const;

/** The subgroup-matrix forward with the default row plan's backward, at head size D. */
function matrixPlan(headSize: number): AttentionPlan {
  const matrix = attentionMatrixFor(gpu, headSize, "f16");
  assert.ok(matrix, `the device offers a subgroup-matrix forward at D = ${headSize}`);
  return { ...DEFAULT_ATTENTION_PLAN, matrix };
}

/**
 * f16 inputs are exact in f32 and so are their products; scores, softmax
 * and sums are f32, so the error is the f16 roundings: of p before P·V
 * (half-ulp 2⁻¹¹ ≈ 4.9e-4 relative, over a convex combination of v: at
 * most that of |v| ≤ 2), of the output (the same) and, in the gradients, of
 * the stored o inside δ = dO·O; as the SIMT plans' f16 tolerance
 * (fused_attention_tiled_test.ts). With scores of ±1000 (|q|, |k| ≤ 32) the
 * gradients reach 9, where f16's half-ulp is 2⁻⁸ ≈ 3.9e-3, and are sums of
 * terms of |k|·|dS| that cancel: the SIMT row plan's error on the same
 * inputs was 7.8e-3 (lavapipe), this plan's the same; atol is 4 of those
 * half-ulps.
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

const MATRIX_FORWARD = "flash_attention_subgroup_matrix_forward";
const isMatrixForward = (key: string) => key.startsWith(MATRIX_FORWARD);

/** The forward ran on subgroup matrices, the backward on the row plan's two kernels. */
function assertMatrixForward(kernels: string[], label: string) {
  assert.ok(isMatrixForward(kernels[0]), `${label}: forward ${kernels[0]}`);
  assert.deepEqual(
    kernels.slice(1).map((k) => k.split(/[^a-z_]/)[0]),
    ["flash_attention_dq", "flash_attention_dkv"],
    `${label}: backward`,
  );
}

Deno.test({
  name: "subgroup-matrix attention: forced, output and gradients match f64 at T = 1, 7, 33, 70, " +
    "D = 8 and 64, B·H > 1, packed" + CANNOT_RUN,
  ...DAWN_TEST,
  async fn() {
    for (const d of [8, 64]) {
      await withPlan(matrixPlan(d), async () => {
        for (const [n, t] of [1, 7, 33, 70].entries()) {
          const c: Case = { dims: { b: 2, t, h: d === 8 ? 3 : 2, d }, packed: n % 2 === 1 };
          assertMatrixForward(await check(c, 100 * d + t), JSON.stringify(c));
        }
      });
    }
  },
});

Deno.test({
  name: "subgroup-matrix attention: scores of ±1000 before scaling (far beyond exp's range) and " +
    "dropout (the same mask as every plan) match f64" + CANNOT_RUN,
  ...DAWN_TEST,
  async fn() {
    await withPlan(matrixPlan(8), async () => {
      // Over several key blocks (T = 70), so the running max moves by hundreds between them.
      for (const [n, t] of [7, 70].entries()) {
        const c: Case = { dims: { b: 1, t, h: 2, d: 8 }, range: 32, packed: n === 1 };
        assertMatrixForward(await check(c, 500 + t), JSON.stringify(c));
      }
      const c: Case = { dims: { b: 2, t: 33, h: 2, d: 8 }, dropout: true };
      assertMatrixForward(await check(c, 600), JSON.stringify(c));
    });
  },
});

Deno.test({
  name: "subgroup-matrix attention: forced, f32, bf16 and a head size the config does not " +
    "divide run the SIMT forward, and still match f64" + CANNOT_RUN,
  ...DAWN_TEST,
  async fn() {
    await withPlan(matrixPlan(8), async () => {
      const cases: [FloatDType, number][] = [["f32", 8], ["bf16", 8], ["f16", 12]];
      for (const [dtype, d] of cases) {
        const kernels = await check({ dims: { b: 1, t: 33, h: 2, d } }, 700 + d, dtype);
        assert.ok(!kernels.some(isMatrixForward), `${dtype} D = ${d}: ${kernels}`);
        assert.ok(kernels[0].startsWith("flash_attention_forward"), `${dtype} D = ${d}`);
      }
    });
  },
});

requireMatricesOnDawn("subgroup-matrix attention", config !== undefined);
