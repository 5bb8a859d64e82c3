/**
 * The fused attention's running row maximum must take every partial: each
 * key of a chunk and the maximum of the chunks before (row plans), each
 * thread's maximum over its columns of a tile row and the maximum of the
 * blocks before (tiled plans). Shift invariance hides a missed partial
 * wherever scores stay small — exp(s − m) is then merely off scale — so the
 * scores here move past exp's range key by key, 128 apart after scaling:
 *
 * - rising, key j scoring 128·j: each query's newest key holds its maximum,
 *   so every key of a chunk, and every thread of a tile row, holds it for
 *   some row; a maximum that skips it gives exp(128) = ∞ there;
 * - falling, key j scoring −128·j: key 0 holds every row's maximum, and a
 *   later chunk or block that forgets it rescales the sums by exp(≥ 2048).
 */
import assert from "node:assert/strict";
import { fusedCausalAttention, Tensor } from "../../../gpu/mod.ts";
import {
  ATTENTION_PLAN_CANDIDATES,
  TILED_ATTENTION_PLANS,
} from "../../../gpu/kernels/attention/plans.ts";
import { GPU_TEST } from "../../helpers/gpu.ts";
import { withPlan } from "../../helpers/attention_plans.ts";
import {
  type AttentionDims,
  causalAttentionWithGrads64,
} from "../../helpers/attention_reference.ts";
import { uniform } from "../../helpers/reference.ts";
import { assertClose } from "../../helpers/assert.ts";

/** T = 40: three chunks of 16 keys, two tiles of 32; one head of 16. */
const DIMS: AttentionDims = { b: 1, t: 40, h: 1, d: 16 };

/** q·k = ±32 · 16j = ±512·j: ±128·j after the scale 1/√16 (exact in f32); v random. */
function inputs(direction: 1 | -1) {
  const { t, d } = DIMS;
  const q = new Float64Array(t * d), k = new Float64Array(t * d);
  for (let j = 0; j < t; j++) {
    q[j * d] = 32;
    k[j * d] = direction * 16 * j;
  }
  return { q, k, v: uniform(t * d, 5) };
}

// A plan of each family: a row plan (a thread per query, keys in chunks of 16) and a tile of
// 32 × 32 with 2 × 2 per thread, so 16 threads share each row of scores.
const PLANS = [
  ATTENTION_PLAN_CANDIDATES.find((p) => p.rows === 16 && p.stage === 0)!,
  TILED_ATTENTION_PLANS.find((p) => p.tile!.bc === 32 && p.tile!.rn === 2)!,
];

Deno.test({
  name: "fused attention: the row maximum takes every key's, thread's and earlier block's " +
    "partial (scores rising and falling 128 a key, past exp's range), row and tiled plans",
  ...GPU_TEST,
  async fn() {
    const shape = [DIMS.b, DIMS.t, DIMS.h * DIMS.d];
    for (const [scores, direction] of [["rising", 1], ["falling", -1]] as const) {
      const { q, k, v } = inputs(direction);
      const zero = new Float64Array(q.length);
      const { o: expected } = causalAttentionWithGrads64(q, k, v, zero, DIMS);
      for (const plan of PLANS) {
        const label = `${scores} scores, ${JSON.stringify(plan)}`;
        await withPlan(plan, async () => {
          const [tq, tk, tv] = [q, k, v].map((x) => Tensor.from(x, shape));
          const o = fusedCausalAttention(tq, tk, tv, { heads: DIMS.h });
          const got = await o.read();
          // Each row is one value row (the others weigh e^-128 or less): f32 rounding only.
          assert.ok(got.every(Number.isFinite), `${label}: a non-finite output`);
          assertClose(got, expected, { atol: 1e-6, rtol: 1e-6 }, label);
          [tq, tk, tv, o].forEach((x) => x.dispose());
        });
      }
    }
  },
});
