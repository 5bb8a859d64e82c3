import assert from "node:assert/strict";
import { tuningStore } from "../../../gpu/tuning/store.ts";
import { retimeFinalists, secondsPerRun, timeCandidates } from "../../../gpu/tuning/timing.ts";
import {
  type Gpu,
  initGpu,
  type InitGpuOptions,
  matmulCandidates,
  type MatmulTiling,
  tuneMatmul,
} from "../../../gpu/mod.ts";
import { matmulClassKey, tilingName } from "../../../gpu/mod.ts";
import { asGpu, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { matmulSettings } from "../../../gpu/mod.ts";

/**
 * A device as `secondsPerRun` sees it, on a clock the test keeps: each run
 * records `gpuMs` of GPU work (and takes `cpuMs` to record), a sync waits
 * for the recorded work and `latencyMs` more; with `timestamps` a profile
 * reports the GPU time of the runs made inside it, as timestamps would.
 */
function scriptedDevice(
  o: { timestamps: boolean; cpuMs: number; gpuMs: number; latencyMs: number; firstMs?: number },
) {
  const clock = { now: 0, queued: 0, runs: 0, profiles: [] as unknown[] };
  const run = () => {
    clock.now += o.cpuMs;
    // The first run compiles: it costs `firstMs`, which no figure may include.
    clock.queued += clock.runs++ === 0 && o.firstMs !== undefined ? o.firstMs : o.gpuMs;
  };
  const sync = () => {
    clock.now += clock.queued + o.latencyMs;
    clock.queued = 0;
    return Promise.resolve();
  };
  const device = {
    device: { features: new Set(o.timestamps ? ["timestamp-query"] : []) },
    sync,
    async profile(fn: () => void, options: unknown) {
      clock.profiles.push(options);
      const before = clock.runs;
      fn();
      await sync();
      return { gpuMs: (clock.runs - before) * o.gpuMs };
    },
  } as unknown as Gpu;
  return { device, clock, run };
}

/** Runs `fn` with `performance.now` reading `clock.now`, then gives the real one back. */
async function onClock<T>(clock: { now: number }, fn: () => Promise<T>): Promise<T> {
  const real = performance.now;
  performance.now = () => clock.now;
  try {
    return await fn();
  } finally {
    performance.now = real;
  }
}

Deno.test("secondsPerRun: with timestamps, the profiled GPU time of three runs after a warm-up, over three", async () => {
  const { device, clock, run } = scriptedDevice({
    timestamps: true,
    cpuMs: 0.5,
    gpuMs: 2.5,
    latencyMs: 40,
    firstMs: 900,
  });
  const seconds = await onClock(clock, () => secondsPerRun(device, run));
  assert.equal(seconds, 2.5 / 1000, "2.5 ms a run: neither the compile nor the wait counts");
  assert.equal(clock.runs, 4, "one warm-up, then three profiled");
  assert.deepEqual(clock.profiles, [{ print: false }], "one silent profile");
});

Deno.test("secondsPerRun: without timestamps, wall time over ×4 repeats until one batch takes 100 ms, or 256 runs", async () => {
  // Times are binary fractions of a millisecond, so every sum below is exact.
  const cases = [
    // A batch of r runs takes r·(0.5 + 2) + 10 ms: 12.5, 20, 50, then 64 runs 170 ms ≥ 100.
    { cpuMs: 0.5, gpuMs: 2, latencyMs: 10, batchMs: 170, repeats: 64 },
    // r·(1/128 + 1/32) + 1 ms: 1.04, 1.16, 1.63, 3.5, then 256 runs 11 ms: the cap.
    { cpuMs: 1 / 128, gpuMs: 1 / 32, latencyMs: 1, batchMs: 11, repeats: 256 },
    // One run takes 150 + 1 + 4 ms: enough alone.
    { cpuMs: 1, gpuMs: 150, latencyMs: 4, batchMs: 155, repeats: 1 },
  ];
  for (const c of cases) {
    const { device, clock, run } = scriptedDevice({ timestamps: false, firstMs: 700, ...c });
    const seconds = await onClock(clock, () => secondsPerRun(device, run));
    assert.equal(seconds, c.batchMs / c.repeats / 1000, JSON.stringify(c));
    // One warm-up run, then batches of 1, 4, 16, ... up to the last.
    let runs = 1;
    for (let r = 1; r <= c.repeats; r *= 4) runs += r;
    assert.equal(clock.runs, runs, `${JSON.stringify(c)}: runs`);
    assert.deepEqual(clock.profiles, [], "no profile without timestamps");
  }
});

Deno.test("retimeFinalists: the three fastest are timed again, slowest of them first, each keeping its better time", async () => {
  // First round: c (index 2) looks fastest only because a noisy spike slowed b (index 1).
  const seconds = [4, 2.5, 2, 3, 9];
  const again: Record<number, number> = { 1: 1, 2: 2.2, 3: 3.5 };
  const order: number[] = [];
  const timings = await retimeFinalists(seconds, (i) => {
    order.push(i);
    return Promise.resolve(again[i]);
  });
  assert.equal(timings, 3);
  assert.deepEqual(order, [3, 1, 2], "d (3 s), b (2.5 s), c (2 s)");
  // b keeps its better second time and now ranks first; c and d keep their first.
  assert.deepEqual(seconds, [4, 1, 2, 3, 9]);

  // Fewer entries than finalists: each once more; ties rank by position.
  const two = [5, 5];
  const twoOrder: number[] = [];
  const twoTimings = await retimeFinalists(two, (i) => {
    twoOrder.push(i);
    return Promise.resolve(i === 0 ? 6 : 4);
  });
  assert.deepEqual([twoTimings, twoOrder, two], [2, [1, 0], [5, 4]]);
  // finalists = 1: only the fastest.
  const one = [3, 1, 2];
  assert.equal(await retimeFinalists(one, () => Promise.resolve(0.5), 1), 1);
  assert.deepEqual(one, [3, 0.5, 2]);
});

Deno.test("timeCandidates: every candidate once, then the finalists again, and the fastest after both", async () => {
  const rounds: Record<string, number[]> = { a: [4], b: [2.5, 1], c: [2, 2.2], d: [3, 3], e: [9] };
  const calls: string[] = [];
  const { best, seconds } = await timeCandidates(["a", "b", "c", "d", "e"], (name) => {
    calls.push(name);
    return Promise.resolve(rounds[name].shift()!);
  });
  assert.equal(best, "b");
  assert.deepEqual(seconds, [4, 1, 2, 3, 9]);
  assert.deepEqual(calls.slice(0, 5), ["a", "b", "c", "d", "e"]);
  assert.equal(calls.length, 8, "three finalists (their order: retimeFinalists)");
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
