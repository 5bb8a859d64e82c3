/**
 * The benchmark's tuning report gives each tuner's winner with the winner's
 * own measurement (not the first candidate's, not the fastest of another
 * class), and no time for a winner read from the cache.
 */
import assert from "node:assert/strict";
import { tuningReport } from "../examples/_bench_tuning.ts";
import type { AttentionTuning, ClassTuning, MatmulTiling } from "../gpu/mod.ts";
import { matmulClassKey } from "../gpu/kernels/gemm/matmul_class.ts";

const tiling = (tm: number, tk: number): MatmulTiling => ({
  variant: "shared",
  tm,
  tn: tm,
  wgx: 8,
  wgy: 8,
  tk,
});

Deno.test("bench tuning report: the winner's own time, none when cached", () => {
  const [slow, best, other] = [tiling(4, 8), tiling(8, 8), tiling(8, 16)];
  const measured: ClassTuning = {
    class: { dtype: "f16", orientation: "nt", size: "large" },
    best,
    measurements: [
      { tiling: slow, seconds: 3e-3, gflops: 100 },
      { tiling: best, seconds: 1e-3, gflops: 300 },
      { tiling: other, seconds: 2e-3, gflops: 150 },
    ],
    cached: false,
  };
  const cached: ClassTuning = {
    class: { dtype: "f32", orientation: "tn", size: "small" },
    best: other,
    measurements: [],
    cached: true,
  };
  const plans: AttentionTuning[] = [{
    dtype: "f32",
    best: { rows: 64, stage: 16 },
    measurements: [{ plan: { rows: 32, stage: 0 }, ms: 2 }],
    cached: false,
  }];
  plans[0].measurements.push({ plan: plans[0].best, ms: 1.5 });
  const report = tuningReport([measured, cached], plans, 4.5);
  assert.equal(report.seconds, 4.5);
  assert.deepEqual(report.matmul.map((p) => [p.key, p.ms, p.gflops, p.candidates, p.cached]), [
    [matmulClassKey(measured.class), 1, 300, 3, false],
    [matmulClassKey(cached.class), null, null, 0, true],
  ]);
  assert.notEqual(report.matmul[0].pick, report.matmul[1].pick, "picks are named apart");
  assert.deepEqual(report.attention, [{
    key: "f32",
    pick: "rows 64 stage 16",
    ms: 1.5,
    gflops: null,
    candidates: 2,
    cached: false,
  }]);
});
