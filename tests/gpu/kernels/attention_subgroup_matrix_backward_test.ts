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
 * adapter's shapes is tests/gpu/device/null_backend_compile_test.ts's.
 */
import assert from "node:assert/strict";
import type { AttentionPlan, FloatDType } from "../../../gpu/mod.ts";
import { DEFAULT_ATTENTION_PLAN } from "../../../gpu/kernels/attention/plans.ts";
import { attentionMatrixFor } from "../../../gpu/kernels/attention/flash_attention_subgroup_matrix.ts";
import { matrixBackwardsFor } from "../../../gpu/kernels/attention/flash_attention_subgroup_matrix_backward.ts";
import { f16MatrixConfig } from "../../helpers/internals.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { requireMatricesOnDawn } from "../../helpers/dawn_pass.ts";
import {
  checkMatrixAttention,
  type MatrixAttentionCase,
  withPlan,
} from "../../helpers/attention_plans.ts";

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
          const c: MatrixAttentionCase = {
            dims: { b: 2, t, h: d === 8 ? 3 : 2, d },
            packed: n % 2 === 1,
          };
          if (t === 256) c.dims.b = 1;
          assertAllMatrices(await checkMatrixAttention(c, 100 * d + t), JSON.stringify(c));
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
        const c: MatrixAttentionCase = {
          dims: { b: 1, t, h: 2, d: 8 },
          range: 32,
          packed: n === 1,
        };
        assertAllMatrices(await checkMatrixAttention(c, 500 + t), JSON.stringify(c));
      }
      for (const [n, t] of [33, 70].entries()) {
        const c: MatrixAttentionCase = {
          dims: { b: 2, t, h: 2, d: 8 },
          dropout: true,
          packed: n === 1,
        };
        assertAllMatrices(await checkMatrixAttention(c, 600 + t), JSON.stringify(c));
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
      const c: MatrixAttentionCase = {
        dims: { b: 2, t: 70, h: 2, d: 8 },
        dropout: true,
        packed: true,
      };
      assertAllMatrices(await checkMatrixAttention(c, 800), JSON.stringify(c));
    });
    await withPlan(matrixPlan(8), async () => {
      const cases: [FloatDType, number][] = [["f32", 8], ["bf16", 8], ["f16", 12]];
      for (const [dtype, d] of cases) {
        const kernels = families(
          await checkMatrixAttention({ dims: { b: 1, t: 33, h: 2, d } }, 900 + d, dtype),
        );
        assert.deepEqual(
          kernels,
          ["flash_attention_forward", "flash_attention_dq", "flash_attention_dkv"],
          `${dtype} D = ${d}`,
        );
      }
    });
  },
});

requireMatricesOnDawn("subgroup-matrix attention backward", config !== undefined);
