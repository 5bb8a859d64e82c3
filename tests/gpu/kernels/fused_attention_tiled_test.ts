import assert from "node:assert/strict";
import { RandomGenerator } from "../../../mod.ts";
import { type AttentionPlan, type FloatDType, tuneAttention } from "../../../gpu/mod.ts";
import {
  ATTENTION_PLAN_CANDIDATES,
  attentionPlanCandidates,
  TILED_ATTENTION_PLANS,
} from "../../../gpu/kernels/attention/flash_attention.ts";
import { tiledAttentionBytes } from "../../../gpu/kernels/attention/flash_attention_tiled.ts";
import { asGpu, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { attentionSettings } from "../../../gpu/kernels/attention/settings.ts";
import { dropoutFactor, runAttention, withPlan } from "../../helpers/attention_plans.ts";
import { assertClose, type Tolerance } from "../../helpers/assert.ts";
import { quantize, uniform } from "../../helpers/reference.ts";
import {
  type AttentionDims,
  causalAttentionWithGrads64,
} from "../../helpers/attention_reference.ts";

// f32: sums of up to 129 products with exp and a division; f16: inputs and results stored in
// f16 (half-ulp 4.9e-4 relative), statistics and math in f32; bf16: the same in bf16
// (half-ulp 2⁻⁹ ≈ 2e-3 relative), as in fused_attention_test.ts.
const TOLERANCE: Record<FloatDType, Tolerance> = {
  f32: { atol: 2e-5, rtol: 2e-4 },
  f16: { atol: 4e-3, rtol: 4e-3 },
  bf16: { atol: 1.6e-2, rtol: 1.6e-2 },
};

type Case = { dims: AttentionDims; dtype: FloatDType; dropout: boolean; packed: boolean };

function inputsFor(dims: AttentionDims, dtype: FloatDType, seed: number) {
  const n = dims.b * dims.t * dims.h * dims.d;
  const [q, k, v, g] = [1, 2, 3, 4].map((s) => quantize(uniform(n, seed + s * 7919, -2, 2), dtype));
  return { q, k, v, g };
}

/** o, dq, dk, dv of one case on the GPU with the current plan, the f64 reference, and the kernels dispatched. */
async function runCase(c: Case, seed: number) {
  const { dims, dtype } = c;
  const x = inputsFor(dims, dtype, seed);
  const range = new RandomGenerator(seed).take(dims.b * dims.h * dims.t * dims.t);
  const dropout = c.dropout ? { p: 0.25, range } : undefined;
  const factor = dropout ? dropoutFactor(dropout.p, range, dims.t) : undefined;
  const expected = causalAttentionWithGrads64(x.q, x.k, x.v, x.g, dims, factor);
  // Packed: q, k, v side by side in one [B, T, 3C] tensor, as CausalSelfAttention runs them.
  const { out, kernels } = await runAttention(x, dims, dtype, { packed: c.packed, dropout });
  return { expected, actual: out, kernels };
}

function assertCase(r: Awaited<ReturnType<typeof runCase>>, c: Case, label: string) {
  for (const name of ["o", "dq", "dk", "dv"] as const) {
    assertClose(r.actual[name], r.expected[name], TOLERANCE[c.dtype], `${label} ${name}`);
  }
}

/** The tile fields of the tiled kernels among kernel keys, e.g. "br=32 bc=16 rm=2 rn=1". */
function tilesOf(kernels: string[]): string[] {
  return kernels.filter((k) => k.startsWith("flash_attention_tiled")).map((k) =>
    ["br", "bc", "rm", "rn"].map((f) => k.match(new RegExp(`\\b${f}=\\d+`))![0]).join(" ")
  );
}

const tileName = (p: AttentionPlan) => {
  const t = p.tile!;
  return `br=${t.br} bc=${t.bc} rm=${t.rm} rn=${t.rn}`;
};

// lavapipe compiles these kernels slowly (about 2 s per plan at head size 16, more at 64 and
// 80), so every plan runs once at head size 16 (T = 70: blocks past the last row and more
// than one block above the diagonal) with dropout, in f32 or f16 by turns, and in bf16 with
// packed q/k/v (the dk/dv pass writes both through one binding); one plan, the one that fits
// lavapipe's 32 KiB at every head size, runs the odd shapes.
Deno.test({
  name: "tiled attention: every register-tiled plan, forced, matches f64 with dropout " +
    "(output and dq, dk, dv), f32 or f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const [n, plan] of TILED_ATTENTION_PLANS.entries()) {
      const dims = { b: 1, t: 70, h: 2, d: 16 };
      const cases: Case[] = [
        { dims, dtype: n % 2 === 0 ? "f32" : "f16", dropout: true, packed: false },
        { dims, dtype: "bf16", dropout: true, packed: true },
      ];
      await withPlan(plan, async () => {
        for (const c of cases) {
          const r = await runCase(c, 11 + n);
          const tiles = [0, 1, 2].map(() => tileName(plan));
          assert.deepEqual(tilesOf(r.kernels), tiles, "3 tiled passes");
          assertCase(r, c, `${tileName(plan)} ${c.dtype}`);
        }
      });
    }
  },
});

const SMALL_TILE = TILED_ATTENTION_PLANS.find((p) => p.tile!.br === 16)!;

Deno.test({
  name: "tiled attention: odd shapes (T = 1, 7, 70, 129, 257; D = 6, 16, 64, 80), f32, f16 " +
    "and bf16, dropout and packed q/k/v, match f64",
  ...GPU_TEST,
  async fn() {
    // Three new kernel configs (f16 at D = 80 packed; f16 at 64 packed with dropout; f32 at 6
    // packed with dropout); the D = 16 cases reuse the f32 dropout kernels of the test above.
    const cases: Case[] = [
      { dims: { b: 2, t: 1, h: 2, d: 16 }, dtype: "f32", dropout: true, packed: false },
      { dims: { b: 2, t: 7, h: 3, d: 80 }, dtype: "f16", dropout: false, packed: true },
      { dims: { b: 1, t: 70, h: 2, d: 80 }, dtype: "f16", dropout: false, packed: true },
      { dims: { b: 1, t: 129, h: 1, d: 64 }, dtype: "f16", dropout: true, packed: true },
      { dims: { b: 1, t: 129, h: 2, d: 16 }, dtype: "f32", dropout: true, packed: false },
      { dims: { b: 1, t: 257, h: 1, d: 16 }, dtype: "f32", dropout: true, packed: false },
      // No multiple of 4: scalar tile elements instead of vec4.
      { dims: { b: 2, t: 70, h: 3, d: 6 }, dtype: "f32", dropout: true, packed: true },
      // bf16: the D = 16 cases reuse the packed dropout kernels of the test above; D = 6 stores
      // single elements (neighbouring threads write the two halves of one word).
      { dims: { b: 2, t: 1, h: 2, d: 16 }, dtype: "bf16", dropout: true, packed: true },
      { dims: { b: 2, t: 7, h: 3, d: 80 }, dtype: "bf16", dropout: false, packed: false },
      { dims: { b: 1, t: 129, h: 2, d: 16 }, dtype: "bf16", dropout: true, packed: true },
      { dims: { b: 2, t: 70, h: 3, d: 7 }, dtype: "bf16", dropout: true, packed: true },
    ];
    await withPlan(SMALL_TILE, async () => {
      for (const [n, c] of cases.entries()) {
        const r = await runCase(c, 23 + n);
        assert.deepEqual(tilesOf(r.kernels), [0, 1, 2].map(() => tileName(SMALL_TILE)));
        assertCase(r, c, `${JSON.stringify(c)}`);
      }
    });
  },
});

Deno.test({
  name: "tiled attention: a tuned tile too big for the head size falls back to the first " +
    "that fits (D = 64, packed f32, T = 129)",
  ...GPU_TEST,
  // As a GPU with lavapipe's 32 KiB, whatever the test machine.
  fn: () => asGpu(fallsBack, { maxComputeWorkgroupStorageSize: 32768 }),
});

async function fallsBack() {
  {
    const limit = gpu.adapterProfile.limits.maxComputeWorkgroupStorageSize;
    const big = TILED_ATTENTION_PLANS[0];
    const fitting = TILED_ATTENTION_PLANS.find((p) => tiledAttentionBytes(p.tile!, 64) <= limit)!;
    // With 32 KiB the 32 × 32 tiles need 37 KiB at D = 64; 32 × 16 fit.
    assert.ok(tiledAttentionBytes(big.tile!, 64) > limit, "the tuned tile does not fit");
    const c: Case = {
      dims: { b: 1, t: 129, h: 2, d: 64 },
      dtype: "f32",
      dropout: false,
      packed: true,
    };
    await withPlan(big, async () => {
      const r = await runCase(c, 41);
      assert.deepEqual(tilesOf(r.kernels), [0, 1, 2].map(() => tileName(fitting)));
      assertCase(r, c, tileName(fitting));
    });
  }
}

Deno.test({
  name: "tiled attention: GPUs get the tiled plans whose tiles fit the workgroup memory; " +
    "CPU adapters none",
  ...GPU_TEST,
  async fn() {
    assert.deepEqual(
      attentionPlanCandidates(gpu),
      ATTENTION_PLAN_CANDIDATES.filter((p) => p.stage === 0),
    );
    await asGpu(() => {
      for (const d of [16, 64, 128]) {
        const tiled = attentionPlanCandidates(gpu, d).filter((p) => p.tile);
        const limit = gpu.adapterProfile.limits.maxComputeWorkgroupStorageSize;
        const fits = TILED_ATTENTION_PLANS.filter((p) => tiledAttentionBytes(p.tile!, d) <= limit);
        assert.deepEqual(tiled, fits, `D = ${d}`);
      }
      assert.equal(attentionPlanCandidates(gpu, 16).filter((p) => p.tile).length, 5, "all at 16");
      return Promise.resolve();
    });
    // WebGPU's default 16 KiB: none at D = 64 (the 16 × 16 tiles need 17.4 KiB), all but the
    // 64 × 16 ones (17.3 KiB) at D = 16.
    await asGpu(() => {
      assert.deepEqual(attentionPlanCandidates(gpu, 64).filter((p) => p.tile), []);
      assert.deepEqual(
        attentionPlanCandidates(gpu, 16).filter((p) => p.tile),
        TILED_ATTENTION_PLANS.filter((p) => p.tile!.br !== 64),
      );
      return Promise.resolve();
    }, { maxComputeWorkgroupStorageSize: 16384 });
  },
});

Deno.test({
  name: "tuneAttention on a GPU times every candidate at the GPT's B·H = 384, T = 256 " +
    "(injected timer), and picks a tiled plan when it is fastest",
  ...GPU_TEST,
  fn: () =>
    asGpu(async () => {
      const fastest = TILED_ATTENTION_PLANS.find((p) => tileName(p) === "br=32 bc=16 rm=2 rn=1")!;
      const seen: AttentionPlan[] = [];
      let workgroups: number[] = [];
      const timer = (plan: AttentionPlan, run: () => void) => {
        seen.push(plan);
        if (plan === fastest && workgroups.length === 0) {
          // Record the dispatches' sizes without running them (384 heads take long on a CPU).
          const dispatch = gpu.batch.dispatch;
          gpu.batch.dispatch = (_kernel, _buffers, _words, size) => {
            workgroups.push(size[0] * (size[1] ?? 1));
          };
          try {
            run();
          } finally {
            gpu.batch.dispatch = dispatch;
          }
        }
        return Promise.resolve(plan === fastest ? 1e-3 : 2e-3);
      };
      try {
        const tuned = await tuneAttention(gpu, { timer });
        for (const t of tuned) {
          assert.equal(t.best, fastest);
          assert.equal(attentionSettings.of(gpu).plans.get(t.dtype), fastest);
          assert.deepEqual(t.measurements.map((m) => m.plan), [
            ...attentionPlanCandidates(gpu, 64, t.dtype),
          ]);
        }
        assert.ok(seen.some((p) => p.tile) && seen.some((p) => !p.tile), "tiled and row plans");
        // Forward, dq and dk/dv: ⌈256 / 32⌉ blocks of each of 64 · 6 heads (grid1d may fold it in 2D).
        assert.equal(workgroups.length, 3);
        for (const w of workgroups) assert.ok(w >= 8 * 384 && w < 8 * 384 + 65535, `${w}`);
        workgroups = [];
      } finally {
        attentionSettings.of(gpu).plans.clear();
      }
    }),
});
