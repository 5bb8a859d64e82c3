/**
 * Fused attention where every score of every row lies far below zero (issue
 * 47, tests that can fail III): q·k about −1600 before scaling (−400 after,
 * far past exp's range of −88), so exp(s − m) underflows to 0 everywhere
 * unless the running maximum m starts at the lowest finite f32 and becomes
 * the row's true (negative) maximum. A maximum that started at 0 would make
 * every row's sum 0 and its output 0/0 (NaN); the extreme-score tests keep a
 * positive score in most rows and cannot see it. A row plan, a staged row
 * plan and a register tile, f32, forward and backward, against f64.
 */
import type { AttentionPlan } from "../../../gpu/mod.ts";
import {
  ATTENTION_PLAN_CANDIDATES,
  TILED_ATTENTION_PLANS,
} from "../../../gpu/kernels/attention/flash_attention.ts";
import { GPU_TEST } from "../../helpers/gpu.ts";
import { runAttention, withPlan } from "../../helpers/attention_plans.ts";
import { assertCloseScaled } from "../../helpers/assert.ts";
import { uniform } from "../../helpers/reference.ts";
import { causalAttentionWithGrads64 } from "../../helpers/attention_reference.ts";

Deno.test({
  name: "fused attention with every score far below zero (about −400 after scaling): a row " +
    "plan, a staged one and a register tile match f64, forward and backward",
  ...GPU_TEST,
  async fn() {
    const dims = { b: 1, t: 37, h: 2, d: 16 }, n = dims.b * dims.t * dims.h * dims.d;
    const a = 10; // q·k ≈ −d·a² = −1600 before the 1/√d scaling
    const x = {
      q: uniform(n, 11, 0.9 * a, 1.1 * a),
      k: uniform(n, 12, -1.1 * a, -0.9 * a),
      v: uniform(n, 13, -2, 2),
      g: uniform(n, 14, -2, 2),
    };
    const expected = causalAttentionWithGrads64(x.q, x.k, x.v, x.g, dims);
    const magnitudes = causalAttentionWithGrads64(x.q, x.k, x.v, x.g, dims, undefined, {
      magnitudes: true,
    });
    const plans: [string, AttentionPlan][] = [
      ["rows 64", ATTENTION_PLAN_CANDIDATES.find((p) => p.rows === 64 && !p.stage)!],
      ["rows 16 staged", ATTENTION_PLAN_CANDIDATES.find((p) => p.stage)!],
      ["tiled", TILED_ATTENTION_PLANS[0]],
    ];
    for (const [label, plan] of plans) {
      await withPlan(plan, async () => {
        const { out } = await runAttention(x, dims, "f32");
        for (const name of ["o", "dq", "dk", "dv"] as const) {
          // Scores of −400 carry an f32 rounding of about 400·2⁻²⁴·√16 ≈ 1e-4 relative.
          assertCloseScaled(
            out[name],
            expected[name],
            { atol: 2e-4, rtol: 2e-4 },
            `${label} ${name}`,
            {
              magnitudes: magnitudes[name],
            },
          );
        }
      });
    }
  },
});
