import assert from "node:assert/strict";
import {
  autocast,
  backward,
  causalAttention,
  CausalSelfAttention,
  causalSoftmax,
  Checkpointed,
  fusedCausalAttention,
  fusedCausalAttentionPacked,
  mul,
  RandomGenerator,
  sum,
  Tensor,
  tidy,
} from "../../../mod.ts";
import {
  type FloatDType,
  type Gpu,
  initGpu,
  type RandomRange,
  tuneAttention,
} from "../../../gpu/mod.ts";
import {
  ATTENTION_PLAN_CANDIDATES,
  attentionPlanCandidates,
} from "../../../gpu/kernels/attention/flash_attention.ts";
import { asGpu, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { attentionSettings } from "../../../gpu/kernels/attention/settings.ts";
import {
  type AttentionValues,
  dropoutFactor,
  runAttention,
  withPlan,
} from "../../helpers/attention_plans.ts";
import { assertClose, type Tolerance } from "../../helpers/assert.ts";
import { quantize, uniform } from "../../helpers/reference.ts";
import {
  type AttentionDims,
  causalAttentionWithGrads64,
} from "../../helpers/attention_reference.ts";

// The issue's odd sizes: T = 1, 7, 33, 129, 257 and D = 16, 32, 64, 128, plus H·D = 3·20
// (not a multiple of any tile), D = 6 (no vec4 rows) and several batches.
const DIMS: AttentionDims[] = [
  { b: 2, t: 1, h: 2, d: 16 },
  { b: 2, t: 7, h: 3, d: 32 },
  { b: 1, t: 33, h: 2, d: 64 },
  { b: 1, t: 129, h: 1, d: 128 },
  { b: 1, t: 257, h: 2, d: 16 },
  { b: 3, t: 33, h: 3, d: 20 },
  { b: 2, t: 9, h: 2, d: 6 }, // a head size that is no multiple of 4: the scalar kernels
];

// bf16 at odd sizes: T = 1, 7 and 129 (past a 64-row workgroup), several heads and batches.
const BF16_DIMS: AttentionDims[] = [
  { b: 2, t: 1, h: 2, d: 16 },
  { b: 2, t: 7, h: 3, d: 16 },
  { b: 1, t: 129, h: 1, d: 64 },
];

/**
 * Head size 128, whose kernels compile slowest (about 25 s each plan and dtype on a cold
 * lavapipe), runs unstaged in f16 and staged in f32, where its tiles do not fit a stage of
 * 32 and the plan runs with 16 (the halving): both kernel families, the halving path, and
 * both dtypes. Every other size runs every case.
 */
function runsAt128(dtype: FloatDType, plan: { stage: number }): boolean {
  return dtype === (plan.stage > 0 ? "f32" : "f16");
}

// f32: sums of up to 257 products, with exp and a division; 2e-5 + 2e-4 relative keeps
// a margin over f32 roundoff. f16: q, k, v, dout and the results are stored in f16
// (half-ulp 4.9e-4 relative); the statistics are f32. bf16: the same stored in bf16
// (half-ulp 2⁻⁹ ≈ 2e-3 relative; the saved output enters δ = dO·O again in backward): the
// worst errors seen are about one half-ulp of the largest values (1.2e-2 on dv up to 5).
const TOLERANCE: Record<FloatDType, Tolerance> = {
  f32: { atol: 2e-5, rtol: 2e-4 },
  f16: { atol: 4e-3, rtol: 4e-3 },
  bf16: { atol: 1.6e-2, rtol: 1.6e-2 },
};

type Inputs = AttentionValues;

function inputsFor(dims: AttentionDims, dtype: FloatDType, seed: number): Inputs {
  const n = dims.b * dims.t * dims.h * dims.d;
  const [q, k, v, g] = [1, 2, 3, 4].map((s) => quantize(uniform(n, seed + s * 7919, -2, 2), dtype));
  return { q, k, v, g };
}

type RunOptions = { fused: boolean; dropout?: { p: number; range: RandomRange } };

/** Output and the three gradients on the GPU, read back. */
async function runOnGpu(x: Inputs, dims: AttentionDims, dtype: FloatDType, options: RunOptions) {
  return (await runAttention(x, dims, dtype, options)).out;
}

function assertAllClose(
  actual: Record<"o" | "dq" | "dk" | "dv", ArrayLike<number>>,
  expected: Record<"o" | "dq" | "dk" | "dv", ArrayLike<number>>,
  tol: Tolerance,
  label: string,
) {
  for (const name of ["o", "dq", "dk", "dv"] as const) {
    assertClose(actual[name], expected[name], tol, `${label} ${name}`);
  }
}

Deno.test({
  name:
    "fusedCausalAttention: output and dq, dk, dv match f64 at odd sizes, f32, f16 and bf16, direct and staged",
  ...GPU_TEST,
  async fn() {
    const cases = [
      ...DIMS.flatMap((dims) => (["f32", "f16"] as const).map((dtype) => ({ dims, dtype }))),
      ...BF16_DIMS.map((dims) => ({ dims, dtype: "bf16" as const })),
    ];
    for (const plan of [{ rows: 64, stage: 0 }, { rows: 16, stage: 32 }]) {
      await withPlan(plan, async () => {
        for (
          const { dims, dtype } of cases.filter((c) => c.dims.d !== 128 || runsAt128(c.dtype, plan))
        ) {
          const x = inputsFor(dims, dtype, dims.t * 31 + dims.d);
          const expected = causalAttentionWithGrads64(x.q, x.k, x.v, x.g, dims);
          const actual = await runOnGpu(x, dims, dtype, { fused: true });
          const label = `${dtype} ${JSON.stringify(dims)} ${JSON.stringify(plan)}`;
          assertAllClose(actual, expected, TOLERANCE[dtype], label);
        }
      });
    }
  },
});

// The plans a GPU adapter picks from (all of them), against f64. T = 70 is above 64, so the
// rows count is the plan's own (planFor lowers it only for T ≤ 64), and tiles of 16 or 32
// rows end past the last row; b·h = 2 keeps runs short (the 128 dims put one head in each
// of two batches). lavapipe compiles these kernels slowly from a cold cache — about 1 s at
// head size 6, 5 s at 64 and 25 s at 128 per plan and dtype — so the full product (12
// plans × 2 dtypes × 3 sizes) would take many minutes. Every plan runs at head size 6 in
// f16 with dropout (the scalar kernels: every rows and stage code path); at 64, the GPU's
// usual size, f16 runs one plan per stage with the rows count below, equal to and above
// the stage, and f32 one staged plan per stage. Head size 128 runs in the odd-size test
// above (unstaged in f16, and staged by 16 in f32: see runsAt128). bf16 runs every plan at head
// size 6 with dropout too (scalar elements: neighbouring rows' threads write the two halves
// of one word).
const PLAN_DIMS: Record<number, AttentionDims> = {
  6: { b: 1, t: 70, h: 2, d: 6 },
  64: { b: 1, t: 70, h: 2, d: 64 },
};

type PlanCase = { d: 6 | 64; dtype: FloatDType; dropout: boolean };

/** Plans (as "rows stage") that also run at head size 64, and in which dtypes. */
const AT_64: Record<string, ("f32" | "f16")[]> = {
  "64 0": ["f16"],
  "16 16": ["f16"],
  "64 16": ["f32", "f16"],
  "16 32": ["f32", "f16"],
  "128 32": ["f16"],
};

/** The cases `plan` runs (see PLAN_DIMS). */
function planCases(plan: { rows: number; stage: number }): PlanCase[] {
  const at64 = AT_64[`${plan.rows} ${plan.stage}`] ?? [];
  return [
    { d: 6, dtype: "f16", dropout: true },
    { d: 6, dtype: "bf16", dropout: true },
    ...at64.map((dtype) => ({ d: 64 as const, dtype, dropout: false })),
  ];
}

/** The `stage` of the forward, dq and dkv dispatches among kernel keys. */
function stagesOf(kernels: string[]): Set<number> {
  const stages = kernels.filter((key) => key.startsWith("flash_attention"))
    .map((key) => Number(key.match(/stage=(\d+)/)![1]));
  assert.equal(stages.length, 3, "forward, dq and dkv");
  return new Set(stages);
}

Deno.test({
  name: "fusedCausalAttention: as on a GPU, every plan matches f64 (f16 and bf16 with dropout " +
    "at head size 6; at 64 one plan per stage and rows relation, f32 and f16)",
  ...GPU_TEST,
  // As a GPU: every plan is a candidate, and stages fit the GPU-like workgroup memory.
  fn: () => asGpu(everyPlanAgainstF64),
});

async function everyPlanAgainstF64() {
  // The register-tiled plans run in tests/gpu/kernels/fused_attention_tiled_test.ts.
  const rowPlans = attentionPlanCandidates(gpu).filter((p) => !p.tile);
  assert.deepEqual(rowPlans, ATTENTION_PLAN_CANDIDATES, "a GPU's row plans");
  const staged = new Set<string>(); // "stage dtype d" of the staged runs, to check coverage
  const range = new RandomGenerator(19).take(2 * 70 * 70);
  for (const [n, plan] of ATTENTION_PLAN_CANDIDATES.entries()) {
    await withPlan(plan, async () => {
      for (const c of planCases(plan)) {
        const dims = PLAN_DIMS[c.d], dropout = c.dropout ? { p: 0.2, range } : undefined;
        const x = inputsFor(dims, c.dtype, 101 * n + c.d);
        const factor = dropout ? dropoutFactor(dropout.p, range, dims.t) : undefined;
        const expected = causalAttentionWithGrads64(x.q, x.k, x.v, x.g, dims, factor);
        const { out, kernels } = await runAttention(x, dims, c.dtype, { fused: true, dropout });
        const label = `${c.dtype} ${JSON.stringify(dims)} ${JSON.stringify(plan)} dropout ${
          dropout?.p ?? 0
        }`;
        assertAllClose(out, expected, TOLERANCE[c.dtype], label);
        const flash = kernels.filter((k) => k.startsWith("flash_attention"));
        assert.ok(flash.every((k) => k.includes(`rows=${plan.rows},`)), `${label}: rows`);
        for (const stage of stagesOf(kernels)) {
          if (stage > 0) staged.add(`${stage} ${c.dtype} ${c.d}`);
        }
      }
    });
  }
  // The staged kernels ran at every size and dtype whose tiles fit the device's workgroup
  // memory (where they do not, the plan runs with a smaller stage).
  for (const plan of ATTENTION_PLAN_CANDIDATES.filter((p) => p.stage > 0)) {
    for (const c of planCases(plan)) {
      const bytes = plan.stage * (2 * c.d * (c.dtype === "f16" ? 2 : 4) + 8);
      if (bytes > gpu.adapterProfile.limits.maxComputeWorkgroupStorageSize) continue;
      const what = `${plan.stage} ${c.dtype} ${c.d}`;
      assert.ok(staged.has(what), `stage ${what} ran`);
    }
  }
}

Deno.test({
  name: "fusedCausalAttention: agrees with the unfused path, with and without dropout",
  ...GPU_TEST,
  async fn() {
    const dims = { b: 2, t: 33, h: 3, d: 16 };
    const range = new RandomGenerator(11).take(dims.b * dims.h * dims.t * dims.t);
    for (const dropout of [undefined, { p: 0.3, range }]) {
      const x = inputsFor(dims, "f32", 5);
      const fused = await runOnGpu(x, dims, "f32", { fused: true, dropout });
      const reference = await runOnGpu(x, dims, "f32", { fused: false, dropout });
      assertAllClose(fused, reference, TOLERANCE.f32, `dropout ${dropout?.p ?? 0}`);
    }
  },
});

Deno.test({
  name: "fusedCausalAttention: dropout matches f64 with the same mask and replays bit for bit",
  ...GPU_TEST,
  async fn() {
    for (const dims of [{ b: 2, t: 7, h: 2, d: 16 }, { b: 1, t: 129, h: 2, d: 32 }]) {
      for (const dtype of ["f32", "f16"] as const) {
        const p = 0.25, range = new RandomGenerator(3).take(dims.b * dims.h * dims.t * dims.t);
        const x = inputsFor(dims, dtype, 17);
        const factor = dropoutFactor(p, range, dims.t);
        const expected = causalAttentionWithGrads64(x.q, x.k, x.v, x.g, dims, factor);
        const first = await runOnGpu(x, dims, dtype, { fused: true, dropout: { p, range } });
        const again = await runOnGpu(x, dims, dtype, { fused: true, dropout: { p, range } });
        const label = `${dtype} ${JSON.stringify(dims)} dropout`;
        assertAllClose(first, expected, TOLERANCE[dtype], label);
        for (const name of ["o", "dq", "dk", "dv"] as const) {
          assert.deepEqual(again[name], first[name], `${label}: ${name} replays exactly`);
        }
      }
    }
  },
});

Deno.test({
  name: "CausalSelfAttention: attention dropout under checkpoint recompute gives identical " +
    "grads, f32 and under bf16 autocast",
  ...GPU_TEST,
  async fn() {
    for (const dtype of ["f32", "bf16"] as const) await recomputedGradsEqual(dtype);
  },
});

/** Checks that checkpointing a CausalSelfAttention with dropout changes none of its gradients. */
async function recomputedGradsEqual(dtype: "f32" | "bf16") {
  const [b, t, c] = [2, 9, 16];
  const x = Tensor.from(uniform(b * t * c, 41), [b, t, c]);
  const w = Tensor.from(uniform(b * t * c, 42), [b, t, c]);
  const grads = async (checkpointed: boolean) => {
    const layer = new CausalSelfAttention(c, 4, { seed: 8, dropout: 0.3 });
    const model = checkpointed ? new Checkpointed(layer) : layer;
    const before = layer.generator.offset;
    const forward = () => {
      const y = model.forward(x);
      assert.equal(y.dtype, dtype, "the layer runs in the autocast dtype");
      return sum(mul(y, w));
    };
    const loss = tidy(() => autocast(forward, { enabled: dtype === "bf16", dtype: "bf16" }));
    loss.backward();
    loss.dispose();
    const out = await Promise.all(layer.parameters().map((p) => p.grad!.read()));
    // One mask drawn per forward: the recompute replays it instead of drawing again.
    assert.equal(layer.generator.offset - before, b * 4 * t * t);
    layer.dispose();
    return out;
  };
  const plain = await grads(false), recomputed = await grads(true);
  plain.forEach((g, i) => assert.deepEqual(recomputed[i], g, `${dtype} parameter ${i}`));
  x.dispose();
  w.dispose();
}

/** Bytes allocated at the peak of one forward + backward of attention over T tokens, above the inputs. */
async function attentionPeak(t: number, fused: boolean): Promise<number> {
  const shape = [1, t, 32];
  const [q, k, v] = [1, 2, 3].map((s) =>
    Tensor.from(uniform(t * 32, s), shape, { requiresGrad: true })
  );
  await gpu.sync();
  const before = gpu.memoryStats().allocatedBytes;
  gpu.resetPeakMemory();
  const loss = tidy(() => sum(causalAttention(q, k, v, { heads: 2, fused })));
  loss.backward();
  await gpu.sync();
  const peak = gpu.memoryStats().peakBytes - before;
  for (const x of [loss, q, k, v]) x.dispose();
  return peak;
}

Deno.test({
  name: "fusedCausalAttention: memory grows linearly in T (the unfused path's grows as T²)",
  ...GPU_TEST,
  async fn() {
    const [fused256, fused1024] = [await attentionPeak(256, true), await attentionPeak(1024, true)];
    const [unfused256, unfused1024] = [
      await attentionPeak(256, false),
      await attentionPeak(1024, false),
    ];
    // 4x the tokens: linear memory is ~4x (pool size classes round up a little), T² is 16x.
    assert.ok(fused1024 <= 5 * fused256, `fused: ${fused256} → ${fused1024} bytes`);
    assert.ok(unfused1024 >= 12 * unfused256, `unfused: ${unfused256} → ${unfused1024} bytes`);
    assert.ok(
      fused1024 * 20 < unfused1024,
      `at T = 1024: fused ${fused1024}, unfused ${unfused1024}`,
    );
    // GPU speed IV's bound: at the GPT's T = 256 the fused peak is at most 0.3x the unfused one.
    assert.ok(fused256 <= 0.3 * unfused256, `at T = 256: fused ${fused256}, unfused ${unfused256}`);
  },
});

Deno.test({
  name: "fusedCausalAttention: f16 or bf16 under autocast; clear errors for bad shapes, " +
    "dtypes, dropout",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const q = Tensor.zeros([2, 3, 8]);
      const low = gpu.f16 ? "f16" : "f32"; // autocast in f16 runs f32 without shader-f16
      assert.equal(autocast(() => fusedCausalAttention(q, q, q, { heads: 2 })).dtype, low);
      const bf16 = autocast(
        () => fusedCausalAttentionPacked(Tensor.zeros([2, 3, 24]), { heads: 2 }),
        {
          dtype: "bf16",
        },
      );
      assert.equal(bf16.dtype, "bf16");
      assert.throws(
        () => fusedCausalAttention(q, Tensor.zeros([2, 4, 8]), q, { heads: 2 }),
        /fusedCausalAttention: q, k and v must all be \[batch, T, heads·headSize\]/,
      );
      assert.throws(
        () => fusedCausalAttention(q, Tensor.zeros([2, 3, 8], { dtype: "f16" }), q, { heads: 2 }),
        /fusedCausalAttention: q, k and v must share one float dtype/,
      );
      assert.throws(
        () => fusedCausalAttention(q, q, q, { heads: 3 }),
        /heads \(3\) must be a positive integer that divides the 8 features/,
      );
      const wide = Tensor.zeros([1, 2, 512]);
      assert.throws(
        () => fusedCausalAttention(wide, wide, wide, { heads: 1 }),
        /head size 512 \(512 features \/ 1 heads\) is above the fused kernel's limit of 256/,
      );
      const range = { key: 1, counter: 0 };
      assert.throws(
        () => fusedCausalAttention(q, q, q, { heads: 2, dropout: { p: 1, range } }),
        /dropout p must be in \[0, 1\), got 1/,
      );
      const late = { key: 1, counter: 2 ** 32 - 10 };
      assert.throws(
        () => fusedCausalAttention(q, q, q, { heads: 2, dropout: { p: 0.1, range: late } }),
        /batch·heads·T·T = 36 weights .* at most 4294967296 fit/,
      );
      assert.throws(
        () => new CausalSelfAttention(8, 2, { dropout: -0.1 }),
        /CausalSelfAttention: dropout must be in \[0, 1\), got -0.1/,
      );
    });
  },
});

Deno.test({
  name:
    "fusedCausalAttention: every plan (rows per workgroup, staging) gives the same bits; the tuner caches its pick",
  ...GPU_TEST,
  async fn() {
    // T = 70: tiles of 16 and 32 keys end inside a workgroup and past the last row. Without
    // dropout f32 at head size 16 (vec4 rows); with it f16 at head size 6 (scalar rows), the
    // kernels the test of every plan against f64 compiles.
    const dropout = { p: 0.2, range: { key: 5, counter: 11 } };
    for (
      const [dims, dtype, options] of [
        [{ b: 2, t: 70, h: 2, d: 16 }, "f32", { fused: true }],
        [PLAN_DIMS[6], gpu.f16 ? "f16" : "bf16", { fused: true, dropout }],
      ] as const
    ) {
      const x = inputsFor(dims, dtype, 3);
      const results: Awaited<ReturnType<typeof runOnGpu>>[] = [];
      for (const plan of ATTENTION_PLAN_CANDIDATES) {
        await withPlan(plan, async () => {
          results.push(await runOnGpu(x, dims, dtype, options));
        });
      }
      for (const [n, r] of results.entries()) {
        assert.deepEqual(r, results[0], JSON.stringify(ATTENTION_PLAN_CANDIDATES[n]));
      }
    }
    try {
      const tuned = await tuneAttention(gpu, { force: true });
      assert.equal(tuned.length, gpu.f16 ? 3 : 2, "f32, f16 where the adapter has it, bf16");
      for (const t of tuned) {
        assert.equal(t.cached, false);
        assert.deepEqual(t.measurements.map((m) => m.plan), [...attentionPlanCandidates(gpu)]);
        const fastest = t.measurements.reduce((a, b) => (b.ms < a.ms ? b : a));
        assert.equal(t.best, fastest.plan);
        assert.equal(attentionSettings.of(gpu).plans.get(t.dtype), t.best);
      }
      const again = await tuneAttention(gpu);
      assert.ok(again.every((r, i) => r.cached && r.best === tuned[i].best), "from the cache");
    } finally {
      attentionSettings.of(gpu).plans.clear();
    }
  },
});

Deno.test({
  name: "fusedCausalAttentionPacked: q, k, v side by side give the same bits as three tensors",
  ...GPU_TEST,
  async fn() {
    for (
      const [dims, dtype] of [
        [{ b: 2, t: 33, h: 3, d: 16 }, "f32"],
        [{ b: 1, t: 9, h: 2, d: 6 }, "f16"],
        [{ b: 1, t: 9, h: 2, d: 6 }, "bf16"],
      ] as const
    ) {
      const x = inputsFor(dims, dtype, 23);
      const separate = await runOnGpu(x, dims, dtype, { fused: true });
      // Row r of qkv is q[r], k[r], v[r] one after another; its gradient is cut back into thirds.
      const { out: packed } = await runAttention(x, dims, dtype, { packed: true });
      const label = `${dtype} ${JSON.stringify(dims)}`;
      for (const name of ["o", "dq", "dk", "dv"] as const) {
        assert.deepEqual(packed[name], separate[name], `${label} ${name}`);
      }
    }
    tidy(() => {
      assert.throws(
        () => fusedCausalAttentionPacked(Tensor.zeros([2, 3, 8]), { heads: 2 }),
        /fusedCausalAttentionPacked: qkv must be \[batch, T, 3·heads·headSize\]/,
      );
      assert.throws(
        () => fusedCausalAttentionPacked(Tensor.zeros([2, 3, 12]), { heads: 3 }),
        /fusedCausalAttentionPacked: heads \(3\) must be a positive integer that divides the 4 features/,
      );
    });
  },
});

Deno.test({
  name: "attention tuning keys bf16 apart from f32: its shapes are noted as bf16 and " +
    "tuneAttention picks a bf16 plan",
  ...GPU_TEST,
  // As a GPU (fresh settings): shapes are noted there, and the timer below runs nothing.
  fn: () =>
    asGpu(async () => {
      const dims = { b: 1, t: 7, h: 2, d: 16 };
      await runOnGpu(inputsFor(dims, "bf16", 5), dims, "bf16", { fused: true });
      const { shapes, plans } = attentionSettings.of(gpu);
      const noted = [...shapes.seen.values()].map((s) => s.shape);
      assert.deepEqual(noted, [{ heads: 2, t: 7, headSize: 16, dtype: "bf16" }]);
      const slowest = ATTENTION_PLAN_CANDIDATES.at(-1)!;
      const tuned = await tuneAttention(gpu, {
        timer: (plan) => Promise.resolve(plan === slowest ? 1e-3 : 2e-3),
      });
      const dtypes = gpu.f16 ? ["f32", "f16", "bf16"] : ["f32", "bf16"];
      assert.deepEqual(tuned.map((t) => t.dtype), dtypes);
      assert.equal(plans.get("bf16"), slowest);
    }),
});

/** Output and qkv gradient bits of bf16 packed attention with dropout, then a causal softmax, on `device`. */
async function bf16AttentionOn(device: Gpu): Promise<number[][]> {
  const [b, t, h, d] = [2, 9, 2, 6], range = { key: 7, counter: 3 };
  const qkv = Tensor.from(uniform(b * t * 3 * h * d, 61, -2, 2), [b, t, 3 * h * d], {
    dtype: "bf16",
    requiresGrad: true,
    gpu: device,
  });
  const g = Tensor.from(uniform(b * t * h * d, 62), [b, t, h * d], { dtype: "bf16", gpu: device });
  const o = fusedCausalAttentionPacked(qkv, { heads: h, dropout: { p: 0.2, range } });
  backward(o, { gradient: g });
  const scores = Tensor.from(uniform(2 * 7 * 7, 63, -4, 4), [2, 7, 7], {
    dtype: "bf16",
    gpu: device,
  });
  const probs = causalSoftmax(scores, { scale: 0.5 });
  const out = [[...await o.read()], [...await qkv.grad!.read()], [...await probs.read()]];
  for (const x of [qkv, g, o, scores, probs]) x.dispose();
  return out;
}

Deno.test({
  name: "bf16 attention and causal softmax run on a device without shader-f16, the same bits",
  ...GPU_TEST,
  async fn() {
    const plain = await initGpu({ f16: "off", matmulTiling: "default", setDefault: false });
    try {
      assert.equal(plain.f16, false);
      assert.deepEqual(await bf16AttentionOn(plain), await bf16AttentionOn(gpu));
    } finally {
      plain.destroy();
    }
  },
});
