/**
 * The benchmark's tuning report gives each tuner's winner with the winner's
 * own measurement (not the first candidate's, not the fastest of another
 * class), and no time for a winner read from the cache; and the benchmark
 * times tuned kernels: what an entry runs untuned is tuned in its warm-up,
 * never while it times.
 */
import assert from "node:assert/strict";
import {
  holdTuningForBench,
  shapePicks,
  shapeTable,
  tuningReport,
} from "../../examples/bench/tuning.ts";
import { gpuTimed, timed } from "../../examples/bench/harness.ts";
import {
  type AttentionTuning,
  type ClassTuning,
  matmul,
  type MatmulShape,
  matmulShapeReport,
  type MatmulTiling,
  pendingTuning,
  type ShapePick,
  Tensor,
  tuneMatmulShapes,
} from "../../gpu/mod.ts";
import { asGpu, gpu, GPU_TEST } from "../helpers/gpu.ts";
import {
  forgetMatmulShapes,
  matmulShapeKey,
  shapeCacheKey,
  tuningStore,
} from "../helpers/internals.ts";
import { withLazyTuning } from "../helpers/lazy_tuning.ts";
import { matmulClassKey } from "../../gpu/mod.ts";

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

Deno.test({
  name: "bench: an entry's warm-up tunes what it ran, before it times; nothing tunes at a wait " +
    "or while it times",
  ...GPU_TEST,
  async fn() {
    const log: string[] = [];
    await withLazyTuning({ onTiming: () => log.push("tune") }, async () => {
      holdTuningForBench(gpu);
      const a = Tensor.full([128, 96], 0.5), b = Tensor.full([96, 64], 0.25);
      // A wait with a product untuned: the bench's device notes it and does not tune.
      matmul(a, b).dispose();
      await gpu.sync();
      assert.equal(log.length, 0, "no tuning at a wait");
      assert.equal(pendingTuning(gpu).length, 1);
      const run = (transB: boolean) => () => {
        log.push("run");
        matmul(a, transB ? a : b, { transB }).dispose();
      };
      await timed(gpu, 3, run(false));
      const tunings = log.filter((e) => e === "tune").length;
      assert.ok(tunings > 0, "the warm-up's product was tuned");
      assert.deepEqual(log, ["run", ...Array(tunings).fill("tune"), "run", "run", "run"]);
      log.length = 0;
      await gpuTimed(gpu, 2, run(true)); // another class (a·aᵀ): tuned after the first run
      assert.equal(log[0], "run");
      const last = log.lastIndexOf("tune");
      assert.ok(last > 0 && log.indexOf("tune") === 1, JSON.stringify(log));
      assert.ok(log.slice(last + 1).length >= 2 && !log.slice(last + 1).includes("tune"));
      assert.deepEqual(pendingTuning(gpu), []);
      a.dispose();
      b.dispose();
    });
  },
});

Deno.test({
  name: "bench's shape table: a tuned shape on one line with its key, its pick (split into " +
    "slices) and the pick's time",
  ...GPU_TEST,
  async fn() {
    await asGpu(async () => {
      const clear = () => {
        forgetMatmulShapes(gpu);
        tuningStore().removeItem(shapeCacheKey(gpu));
      };
      clear();
      try {
        const long: MatmulShape = {
          m: 64,
          n: 64,
          k: 4096,
          batch: 1,
          orientation: "nt",
          dtype: "f32",
          out: "f32",
          bias: "none",
          activation: "none",
        };
        // A timer under which any split pick is fastest, and more slices faster still.
        const timer = (pick: ShapePick) =>
          Promise.resolve(pick.slices > 1 ? 1e-4 - pick.slices * 1e-7 : 1e-3);
        const [tuned] = await tuneMatmulShapes(gpu, { shapes: [long], timer, cache: true });
        assert.ok(tuned.pick.slices > 1, `split (${tuned.pick.slices} slices)`);
        assert.deepEqual(matmulShapeReport(gpu).map((r) => r.key), [matmulShapeKey(long)]);
        const lines = shapeTable(shapePicks(gpu), 1).split("\n");
        assert.equal(lines.length, 2, lines.join("\n"));
        assert.ok(
          lines[1].includes(matmulShapeKey(long)) &&
            lines[1].includes(`split ${tuned.pick.slices}`),
          lines[1],
        );
        assert.ok(lines[1].includes(`${(tuned.seconds * 1000).toFixed(3)} ms`), lines[1]);
      } finally {
        clear();
      }
    });
  },
});
