import assert from "node:assert/strict";
import {
  autocast,
  causalSoftmax,
  customAutocastLists,
  mul,
  sum,
  Tensor,
  tidy,
} from "../../../mod.ts";
import { DTYPES } from "../../../gpu/mod.ts";
import { GPU_TEST, withEachRowLayout } from "../../helpers/gpu.ts";
import { gradcheck } from "../../helpers/gradcheck.ts";
import { quantize, uniform } from "../../helpers/reference.ts";
import { assertClose, TOL } from "../../helpers/assert.ts";
import { causalSoftmax64, causalSoftmaxGrad64 } from "../../helpers/attention_reference.ts";

// T = 1 (one visible entry), odd sizes, T = 64 (the longest rows run one per thread), T = 65
// and 129 (one workgroup per row, rows longer than its 64 threads), leading axes of several ranks.
const SHAPES = [[1, 1], [5, 5], [2, 3, 7, 7], [2, 64, 64], [65, 65], [1, 129, 129]];

/** Scores whose masked entries hold huge values: a kernel that read them would be wrong. */
function scores(shape: number[], dtype: "f32" | "f16" | "bf16", seed: number): Float64Array {
  const t = shape.at(-1)!, n = shape.reduce((a, b) => a * b);
  const x = uniform(n, seed, -30, 30);
  for (let i = 0; i < n; i++) if (i % t > Math.floor(i / t) % t) x[i] = 6e4;
  return quantize(x, dtype);
}

Deno.test({
  name:
    "causalSoftmax: forward and backward match f64, f32, f16 and bf16, masked entries exactly 0",
  ...GPU_TEST,
  async fn() {
    await withEachRowLayout(async () => {
      for (const shape of SHAPES) {
        for (const dtype of DTYPES) {
          for (const scale of [1, 0.25]) {
            const t = shape.at(-1)!, n = shape.reduce((a, b) => a * b);
            const label = `${dtype} [${shape}] scale ${scale}`;
            const x = scores(shape, dtype, n + t);
            const g = quantize(uniform(n, 5), dtype);
            const tx = Tensor.from(x, shape, { dtype, requiresGrad: true });
            const y = causalSoftmax(tx, { scale });
            assert.equal(y.dtype, dtype);
            const ref = causalSoftmax64(x, t, scale);
            const actual = await y.read();
            assertClose(actual, ref, TOL[dtype], label);
            y.backward({ gradient: Tensor.from(g, shape, { dtype }) });
            const dx = await tx.grad!.read();
            assertClose(dx, causalSoftmaxGrad64(ref, g, t, scale), TOL[dtype], `${label} grad`);
            for (let i = 0; i < n; i++) {
              if (i % t > Math.floor(i / t) % t) {
                assert.ok(actual[i] === 0 && dx[i] === 0, `${label}: masked element ${i} not 0`);
              }
            }
            tx.grad!.dispose();
            tx.dispose();
            y.dispose();
          }
        }
      }
    });
  },
});

Deno.test({
  // NOTE: f16 is checked against the f64 rule above, not by finite differences: f16 rounds each
  // stored probability by up to 2.4e-4, which divided by 2ε swamps a directional derivative of ~1e-2.
  name: "causalSoftmax: gradients agree with finite differences (f32)",
  ...GPU_TEST,
  async fn() {
    const w = Tensor.from(uniform(2 * 6 * 6, 1), [2, 6, 6]);
    await gradcheck(
      "causalSoftmax",
      ([x]) => sum(mul(causalSoftmax(x), w)),
      [uniform(72, 2, -2, 2)],
      [[2, 6, 6]],
    );
    await gradcheck(
      "causalSoftmax scale 0.3",
      ([x]) => sum(mul(causalSoftmax(x, { scale: 0.3 }), w)),
      [uniform(72, 3, -4, 4)],
      [[2, 6, 6]],
    );
    w.dispose();
  },
});

Deno.test({
  name:
    "causalSoftmax: f16 and bf16 scores stay so under autocast unless denied; bad shapes are errors",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const x = Tensor.zeros([2, 4, 4], { dtype: "f16" });
      assert.equal(autocast(() => causalSoftmax(x)).dtype, "f16");
      const lists = customAutocastLists({ deny: ["causal_softmax"] });
      assert.equal(autocast(() => causalSoftmax(x), { lists }).dtype, "f32");
      const bf16 = Tensor.zeros([2, 4, 4], { dtype: "bf16" });
      assert.equal(autocast(() => causalSoftmax(bf16), { dtype: "bf16" }).dtype, "bf16");
      assert.equal(autocast(() => causalSoftmax(bf16), { dtype: "bf16", lists }).dtype, "f32");
      assert.throws(
        () => causalSoftmax(Tensor.zeros([2, 3, 4])),
        /causalSoftmax: scores f32 \[2, 3, 4\] must be \[\.\.\., T, T\]/,
      );
      assert.throws(() => causalSoftmax(Tensor.zeros([4])), /must be \[\.\.\., T, T\]/);
      assert.throws(
        () => causalSoftmax(Tensor.from([0, 1, 2, 3], [2, 2], { dtype: "i32" })),
        /causalSoftmax: needs float scores \(f32, f16 or bf16\), got i32 \[2, 2\]/,
      );
      assert.throws(
        () => causalSoftmax(Tensor.zeros([2, 2]), { scale: NaN }),
        /scale must be a finite number/,
      );
    });
  },
});
