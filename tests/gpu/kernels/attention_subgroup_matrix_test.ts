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
 * tests/gpu/kernels/attention_plans_subgroup_matrix_test.ts.
 */
import assert from "node:assert/strict";
import type { AttentionPlan, FloatDType } from "../../../gpu/mod.ts";
import { DEFAULT_ATTENTION_PLAN } from "../../../gpu/kernels/attention/plans.ts";
import { attentionMatrixFor } from "../../../gpu/kernels/attention/flash_attention_subgroup_matrix.ts";
import { f16MatrixConfig } from "../../helpers/internals.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import {
  checkMatrixAttention,
  type MatrixAttentionCase,
  withPlan,
} from "../../helpers/attention_plans.ts";
import { requireMatricesOnDawn } from "../../helpers/dawn_pass.ts";

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
          const c: MatrixAttentionCase = {
            dims: { b: 2, t, h: d === 8 ? 3 : 2, d },
            packed: n % 2 === 1,
          };
          assertMatrixForward(await checkMatrixAttention(c, 100 * d + t), JSON.stringify(c));
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
        const c: MatrixAttentionCase = {
          dims: { b: 1, t, h: 2, d: 8 },
          range: 32,
          packed: n === 1,
        };
        assertMatrixForward(await checkMatrixAttention(c, 500 + t), JSON.stringify(c));
      }
      const c: MatrixAttentionCase = { dims: { b: 2, t: 33, h: 2, d: 8 }, dropout: true };
      assertMatrixForward(await checkMatrixAttention(c, 600), JSON.stringify(c));
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
        const kernels = await checkMatrixAttention(
          { dims: { b: 1, t: 33, h: 2, d } },
          700 + d,
          dtype,
        );
        assert.ok(!kernels.some(isMatrixForward), `${dtype} D = ${d}: ${kernels}`);
        assert.ok(kernels[0].startsWith("flash_attention_forward"), `${dtype} D = ${d}`);
      }
    });
  },
});

requireMatricesOnDawn("subgroup-matrix attention", config !== undefined);
