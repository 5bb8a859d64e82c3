/**
 * The embedding table gradient with ids grouped first (gpu/kernels/
 * embedding_grad.ts), the GPU path, forced on lavapipe: against f64 at odd
 * shapes, f32 and f16, across several passes, with skewed ids; bit for bit
 * the CPU kernel's f32 sums, and the same bits run after run.
 */
import assert from "node:assert/strict";
import { embedding, Tensor, tidy } from "../../../gpu/mod.ts";
import { IDS_PER_PASS, launchScatterAdd } from "../../../gpu/kernels/embedding.ts";
import { asGpu, dispatchedKernels, GPU_TEST } from "../../helpers/gpu.ts";
import { quantize, rng, uniform } from "../../helpers/reference.ts";
import { assertClose, TOL, type Tolerance } from "../../helpers/assert.ts";

/** f64 table gradient: row v sums the rows of g whose id is v. */
function scatter64(g: Float64Array, ids: number[], vocab: number, dim: number): Float64Array {
  const out = new Float64Array(vocab * dim);
  ids.forEach((v, r) => {
    for (let d = 0; d < dim; d++) out[v * dim + d] += g[r * dim + d];
  });
  return out;
}

// f32 sums of up to ~16k terms of |g| <= 1 (skewed ids put every row on one id).
const F32_TOL: Tolerance = { atol: 1e-3, rtol: 1e-5 };
// f16 output: the f32 sum rounded to f16 once per pass (half an ulp, 4.9e-4 relative).
const F16_TOL: Tolerance = { atol: 2e-3, rtol: 2e-3 };

const CASES: [number, number, number, string][] = [
  // [ids, vocab, dim, id distribution]
  [1, 1, 1, "uniform"],
  [65, 7, 7, "uniform"],
  [383, 65, 64, "uniform"],
  [4097, 385, 7, "uniform"],
  [4097, 65, 385, "skewed"],
  [IDS_PER_PASS + 383, 7, 3, "uniform"], // two passes, the second adding to the first
];

function idsOf(n: number, vocab: number, kind: string, seed: number): number[] {
  const random = rng(seed);
  return Array.from(
    { length: n },
    () =>
      kind === "skewed"
        ? (random() < 0.9 ? 3 % vocab : Math.floor(random() * vocab))
        : Math.floor(random() * vocab),
  );
}

Deno.test({
  name:
    "embedding gradient, ids grouped: matches f64 and the CPU kernel's f32 bits, repeats exactly",
  ...GPU_TEST,
  async fn() {
    for (const [n, vocab, dim, kind] of CASES) {
      for (const dtype of ["f32", "f16", "bf16"] as const) {
        const label = `${dtype} ids ${n} table [${vocab}, ${dim}] ${kind}`;
        const ids = idsOf(n, vocab, kind, n + vocab);
        const g = quantize(uniform(n * dim, n + dim), dtype);
        const tg = Tensor.from(g, [n, dim], { dtype });
        const tids = Tensor.from(ids, [n], { dtype: "i32" });
        const cpu = await tidy(() => launchScatterAdd(tg, tids, [vocab, dim], dtype)).read();
        const runs = await asGpu(async () => {
          const keys = dispatchedKernels(() =>
            tidy(() => void launchScatterAdd(tg, tids, [vocab, dim], dtype))
          );
          assert.ok(keys.some((k) => k.startsWith("embedding_grad_sum")), label);
          assert.ok(!keys.some((k) => k.startsWith("embedding_scatter_add")), label);
          const out = [];
          for (let i = 0; i < 3; i++) {
            out.push(await tidy(() => launchScatterAdd(tg, tids, [vocab, dim], dtype)).read());
          }
          return out;
        });
        const ref = scatter64(g, ids, vocab, dim);
        assertClose(
          runs[0],
          ref,
          dtype === "f32" ? F32_TOL : dtype === "f16" ? F16_TOL : TOL.bf16,
          label,
        );
        assert.deepEqual(runs[1], runs[0], `${label}: a second run`);
        assert.deepEqual(runs[2], runs[0], `${label}: a third run`);
        assert.deepEqual(runs[0], cpu, `${label}: the CPU kernel's bits`);
        tg.dispose();
        tids.dispose();
      }
    }
  },
});

Deno.test({
  name: "embedding gradient, ids grouped: through embedding().backward(), ids of rank 2",
  ...GPU_TEST,
  async fn() {
    const [vocab, dim] = [65, 33];
    const ids = idsOf(7 * 129, vocab, "uniform", 5);
    const tableValues = uniform(vocab * dim, 6), g = uniform(ids.length * dim, 7);
    await asGpu(async () => {
      const table = Tensor.from(tableValues, [vocab, dim], { requiresGrad: true });
      const y = embedding(table, Tensor.from(ids, [7, 129], { dtype: "i32" }));
      y.backward({ gradient: Tensor.from(g, [7, 129, dim]) });
      assertClose(
        await table.grad!.read(),
        scatter64(Float64Array.from(g, (v) => Math.fround(v)), ids, vocab, dim),
        F32_TOL,
        "grad",
      );
    });
  },
});
