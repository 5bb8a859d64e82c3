import assert from "node:assert/strict";
import { tuningStore } from "../gpu/tuning/store.ts";
import { timeCandidates } from "../gpu/tuning/timing.ts";
import {
  initGpu,
  type InitGpuOptions,
  matmulCandidates,
  type MatmulTiling,
  tuneMatmul,
} from "../gpu/mod.ts";
import { matmulClassKey, tilingName } from "../gpu/kernels/gemm/matmul_class.ts";
import { asGpu, gpu, GPU_TEST } from "./_gpu.ts";
import { matmulSettings } from "../gpu/kernels/gemm/settings.ts";

Deno.test("tuners: the finalists are timed again and keep their better time", async () => {
  // First round: c looks fastest only because a noisy spike slowed b down.
  const rounds: Record<string, number[]> = { a: [4], b: [2.5, 1], c: [2, 2.2], d: [3, 3], e: [9] };
  const calls: string[] = [];
  const { best, seconds } = await timeCandidates(["a", "b", "c", "d", "e"], (name) => {
    calls.push(name);
    return Promise.resolve(rounds[name].shift()!);
  });
  assert.equal(best, "b");
  assert.deepEqual(seconds, [4, 1, 2, 3, 9]);
  // Every candidate once, then the three fastest again, slowest of them first.
  assert.deepEqual(calls, ["a", "b", "c", "d", "e", "d", "b", "c"]);
});

Deno.test({
  name: "matmul tuner: picks what an injected timer says is fastest (finalists re-timed), " +
    "reports consistent figures, and caches nothing a test timer measured",
  ...GPU_TEST,
  async fn() {
    await asGpu(async () => {
      const c = { dtype: "f32", orientation: "nt", size: "small" } as const;
      const candidates = matmulCandidates(gpu, "f32");
      // First round: candidate 3 looks fastest; re-timed, candidate 7 (second) beats it.
      const rounds = new Map(candidates.map((t, i) => {
        const first = i === 3 ? 1e-4 : i === 7 ? 2e-4 : 1e-3 + i * 1e-5;
        return [t, [first, i === 7 ? 5e-5 : first * 3]];
      }));
      const calls: MatmulTiling[] = [];
      const [result] = await tuneMatmul(gpu, {
        classes: [c],
        timer: (tiling) => {
          calls.push(tiling);
          return Promise.resolve(rounds.get(tiling)!.shift()!);
        },
      });
      assert.equal(calls.length, candidates.length + 3, "every candidate, then three finalists");
      assert.equal(result.best, candidates[7]);
      assert.equal(matmulSettings.of(gpu).classTilings.get(matmulClassKey(c)), candidates[7]);
      assert.deepEqual(result.measurements.map((m) => m.tiling), candidates);
      assert.equal(result.measurements[7].seconds, 5e-5);
      assert.equal(result.measurements[3].seconds, 1e-4, "a finalist keeps its better time");
      const flops = 2 * 64 * 128 * 256; // the small class's problem
      for (const m of result.measurements) {
        assert.ok(
          Math.abs(m.gflops * 1e9 * m.seconds - flops) <= 1e-9 * flops,
          tilingName(m.tiling),
        );
      }
    });
    const stored = tuningStore().keys();
    assert.ok(
      stored.every((key) => !key.startsWith("halfstep.matmulTuning") || !key.includes("gpu-like")),
      `a test timer's winners were cached: ${stored}`,
    );
  },
});

Deno.test({
  name: "matmul tuner: reports progress before the first measurement and after each, " +
    "and initGpu refuses an onProgress that is not a function",
  ...GPU_TEST,
  async fn() {
    const classes = [
      { dtype: "f32", orientation: "nn", size: "small" },
      { dtype: "f32", orientation: "tn", size: "small" },
    ] as const;
    const seen: string[] = [];
    const { classTilings } = matmulSettings.of(gpu);
    const tuned = new Map(classTilings); // the fake timer's winners must not stay
    try {
      await tuneMatmul(gpu, {
        classes,
        timer: () => Promise.resolve(1e-3),
        onProgress: ({ task, done, total }) => seen.push(`${task} ${done}/${total}`),
      });
    } finally {
      classTilings.clear();
      for (const [k, v] of tuned) classTilings.set(k, v);
    }
    assert.deepEqual(seen, ["matmul tilings 0/2", "matmul tilings 1/2", "matmul tilings 2/2"]);
    const anyOptions = { onProgress: 5 } as unknown as InitGpuOptions;
    await assert.rejects(
      initGpu(anyOptions),
      /^ValueError: initGpu.*onProgress must be a function/,
    );
  },
});
