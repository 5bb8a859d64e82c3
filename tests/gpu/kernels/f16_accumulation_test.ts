/**
 * `f16Accumulation: "chunked"`: f16 matmuls on the GPU (blocked, vec4) tilings sum
 * each run of F16_CHUNK products in f16 and add the runs into f32. Checked
 * against an f64 product of the same f16 inputs over K from 16 to 8192, with
 * random and all-positive large inputs, in every orientation, against the
 * stated bound; an f16 overflow in a run must reach the result and make the
 * GradScaler skip the step.
 */
import assert from "node:assert/strict";
import {
  AmpTrainer,
  initGpu,
  Linear,
  matmul,
  mean,
  RandomGenerator,
  SGD,
  Tensor,
  ValueError,
} from "../../../mod.ts";
import { launchMatmulInto } from "../../../gpu/kernels/gemm/matmul.ts";
import { F16_CHUNK, type MatmulTiling, tilingName } from "../../../gpu/mod.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { quantize } from "../../helpers/reference.ts";
import { matmulSettings } from "../../../gpu/kernels/gemm/settings.ts";

const U16 = 2 ** -11, U32 = 2 ** -24;
/** The GPU tilings that sum in f16 chunks: blocked, and vec4 (f16 tiles under chunks). */
const GPU_TILINGS: MatmulTiling[] = [
  { variant: "blocked", tm: 4, tn: 4, wgx: 16, wgy: 16, tk: 16 },
  { variant: "blocked", tm: 8, tn: 8, wgx: 16, wgy: 16, tk: 8 },
  { variant: "vec4", tm: 4, tn: 4, wgx: 16, wgy: 16, tk: 16 },
];

/**
 * The stated bound on |C − C₆₄| for one result: each run of L products summed
 * in f16 (L·u16 of its Σ|ab|), the runs summed in f32 (⌈K/L⌉·u32 of Σ|ab|),
 * and f16 underflow (half the smallest subnormal, 2⁻²⁵, per product).
 */
function chunkedBound(absSum: number, k: number, chunk: number): number {
  return (chunk * U16 + Math.ceil(k / chunk) * U32) * absSum + k * 2 ** -25;
}

/** Runs one f16 product with f32 output; returns the largest error / (bound of f32 math or chunked). */
async function worstError(
  tiling: MatmulTiling,
  dims: { m: number; n: number; k: number; orientation: "nn" | "nt" | "tn" },
  values: (count: number) => Float32Array,
): Promise<{ ratioToBound: number; inUnits: number }> {
  const { m, n, k, orientation } = dims;
  const a = quantize(values(m * k), "f16");
  const b = quantize(values(k * n), "f16");
  const transA = orientation === "tn", transB = orientation === "nt";
  // Element (i, q) of op(A) and (q, j) of op(B) in their stored layouts.
  const aAt = (i: number, q: number) => a[transA ? q * m + i : i * k + q];
  const bAt = (q: number, j: number) => b[transB ? j * k + q : q * n + j];
  const ta = Tensor.from(a, [m * k], { dtype: "f16" });
  const tb = Tensor.from(b, [k * n], { dtype: "f16" });
  const c = Tensor.empty([m * n], "f32", gpu);
  launchMatmulInto(
    {
      batch: 1,
      m,
      n,
      k,
      a: { batch: 0, row: transA ? 1 : k, col: transA ? m : 1 },
      b: { batch: 0, row: transB ? 1 : n, col: transB ? k : 1 },
    },
    ta,
    tb,
    c,
    {},
    tiling,
  );
  const out = await c.read();
  [ta, tb, c].forEach((t) => t.dispose());
  const chunk = matmulSettings.of(gpu).f16Accumulation === "chunked"
    ? Math.min(F16_CHUNK, tiling.tk)
    : 0;
  let ratioToBound = 0, inUnits = 0;
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let exact = 0, absSum = 0;
      for (let q = 0; q < k; q++) {
        const p = aAt(i, q) * bAt(q, j);
        exact += p;
        absSum += Math.abs(p);
      }
      const err = Math.abs(out[i * n + j] - exact);
      const bound = chunk ? chunkedBound(absSum, k, chunk) : k * U32 * absSum;
      ratioToBound = Math.max(ratioToBound, err / bound);
      inUnits = Math.max(inUnits, err / (absSum * U16));
    }
  }
  return { ratioToBound, inUnits };
}

async function withAccumulation<T>(mode: "f32" | "chunked", fn: () => Promise<T>): Promise<T> {
  const settings = matmulSettings.of(gpu);
  const before = settings.f16Accumulation;
  settings.f16Accumulation = mode;
  try {
    return await fn();
  } finally {
    settings.f16Accumulation = before;
  }
}

Deno.test({
  name: "f16 chunked accumulation: within the stated bound for K = 16…8192, every orientation",
  ...GPU_TEST,
  async fn() {
    let largestChunked = 0, largestF32 = 0;
    for (const [kindIndex, kind] of ["random", "positive"].entries()) {
      for (const k of [16, 64, 256, 1024, 4096, 8192]) {
        for (const [t, tiling] of GPU_TILINGS.entries()) {
          for (const orientation of ["nn", "nt", "tn"] as const) {
            const rng = new RandomGenerator(k + 10 * kindIndex + t);
            // Random signs, or all positive and large (every partial sum grows).
            const values = (count: number) =>
              kind === "random" ? rng.uniform(count, -1, 1) : rng.uniform(count, 8, 16);
            const dims = { m: 7, n: 33, k, orientation };
            const label = `${kind} K=${k} ${orientation} ${tilingName(tiling)}`;
            const chunked = await withAccumulation(
              "chunked",
              () => worstError(tiling, dims, values),
            );
            const exact = await withAccumulation("f32", () => worstError(tiling, dims, values));
            assert.ok(
              chunked.ratioToBound <= 1,
              `${label}: chunked error ${chunked.ratioToBound}× the bound`,
            );
            assert.ok(
              exact.ratioToBound <= 1,
              `${label}: f32 error ${exact.ratioToBound}× its bound`,
            );
            largestChunked = Math.max(largestChunked, chunked.inUnits);
            largestF32 = Math.max(largestF32, exact.inUnits);
          }
        }
      }
    }
    // The chunked kernels really sum in f16: their error is in f16 units, f32 math's far below.
    assert.ok(largestChunked > 0.25, `chunked error up to ${largestChunked} u16: no f16 sums?`);
    assert.ok(largestF32 < 0.05, `f32 accumulation error up to ${largestF32} u16`);
  },
});

Deno.test({
  name: "f16 chunked accumulation: an overflow inside a run reaches the result and the GradScaler",
  ...GPU_TEST,
  async fn() {
    const chosen = matmulSettings.of(gpu).tiling;
    matmulSettings.of(gpu).tiling = GPU_TILINGS[1];
    try {
      // Each run's products overflow f16 (200·512 > 65504) while the exact sum is 0.
      const poisoned = await withAccumulation("chunked", async () => {
        const a = Tensor.from(new Float32Array(16).map((_, q) => (q < 8 ? 200 : -200)), [1, 16], {
          dtype: "f16",
        });
        const b = Tensor.full([16, 1], 512, { dtype: "f16" });
        const c = matmul(a, b);
        const out = (await c.read())[0];
        [a, b, c].forEach((t) => t.dispose());
        return out;
      });
      assert.ok(!Number.isFinite(poisoned), `an overflowed run must not vanish (got ${poisoned})`);

      // A linear layer whose weight gradient gᵀ·x runs into the same overflow in
      // f16 runs (dL/dy = 2^16 / 128 = 512, x = ±200): f32 sums keep it finite.
      const skippedUnder = async (mode: "f32" | "chunked") =>
        await withAccumulation(mode, async () => {
          const model = new Linear(16, 8, { seed: new RandomGenerator(3) });
          const optimizer = new SGD(model.parameters(), { lr: 0.1 });
          const trainer = new AmpTrainer(model, optimizer);
          const x = new Float32Array(16 * 16).map((_, e) => (e < 128 ? 200 : -200));
          trainer.step(() => mean(model.forward(Tensor.from(x, [16, 16])))).dispose();
          const result = {
            skipped: await trainer.scaler.lastStepSkipped(),
            scale: await trainer.scaler.getScale(),
          };
          trainer.dispose();
          optimizer.dispose();
          return result;
        });
      assert.deepEqual(await skippedUnder("f32"), { skipped: false, scale: 2 ** 16 });
      assert.deepEqual(await skippedUnder("chunked"), { skipped: true, scale: 2 ** 15 });
    } finally {
      matmulSettings.of(gpu).tiling = chosen;
    }
  },
});

Deno.test({
  name: "f16 chunked accumulation: f32 products are unchanged, and a bad option is a clear error",
  ...GPU_TEST,
  async fn() {
    const a = Tensor.from(new RandomGenerator(5).uniform(33 * 40, -1, 1), [33, 40]);
    const b = Tensor.from(new RandomGenerator(6).uniform(40 * 9, -1, 1), [40, 9]);
    const chosen = matmulSettings.of(gpu).tiling;
    matmulSettings.of(gpu).tiling = GPU_TILINGS[0];
    try {
      const plain = await withAccumulation("f32", () => matmul(a, b).read());
      const chunked = await withAccumulation("chunked", () => matmul(a, b).read());
      assert.deepEqual(chunked, plain, "f32 operands never sum in f16");
    } finally {
      matmulSettings.of(gpu).tiling = chosen;
    }
    await assert.rejects(
      // deno-lint-ignore no-explicit-any
      () => initGpu({ f16Accumulation: "f8" as any, setDefault: false }),
      (e: unknown) =>
        e instanceof ValueError && /f16Accumulation must be "f32" or "chunked"/.test(e.message),
    );
  },
});
