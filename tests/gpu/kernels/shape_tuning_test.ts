/**
 * Per-shape matmul tuning on GPUs (gpu/kernels/gemm/shape_tuner.ts, gpu/kernels/gemm/shape_picks.ts),
 * through the GPU-like adapter profile and injected timers: each shape gets
 * its own pick, dispatch uses it (the dispatched kernel's key and grid), the
 * results still match f64, picks are cached per adapter and a cached entry
 * of another adapter, or a malformed one, is ignored; the tuning budget.
 */
import assert from "node:assert/strict";
import { tuningStore } from "../../helpers/internals.ts";
import {
  matmul,
  type MatmulShape,
  matmulShapeReport,
  type MatmulTiling,
  SHAPE_TRIAL_BUDGET,
  type ShapePick,
  Tensor,
  tuneMatmulShapes,
} from "../../../gpu/mod.ts";
import {
  forgetMatmulShapes,
  matmulShapeKey,
  shapeCacheKey,
} from "../../../gpu/kernels/gemm/shape_picks.ts";
import { waveSlices } from "../../../gpu/kernels/gemm/gemm.ts";
import { matmulCandidates } from "../../../gpu/kernels/gemm/candidates.ts";
import { tilingKind } from "../../../gpu/kernels/gemm/tilings.ts";
import { asGpu, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { matmul64, uniform } from "../../helpers/reference.ts";
import { assertClose, TOL } from "../../helpers/assert.ts";

/** Two products of one class (f32, A·Bᵀ, medium) that differ only in k. */
const LONG: MatmulShape = {
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
const SHORT: MatmulShape = { ...LONG, k: 1024 };

/** The GPU tilings a shape of `dtype` is tuned with on this device. */
const gpuTilings = (dtype: "f32" | "f16" = "f32") =>
  matmulCandidates(gpu, dtype).filter((t) => tilingKind(t).forGpus);

/** A timer that says `fast` is fastest (ties broken by more slices), and counts its calls. */
function favouring(fast: (pick: ShapePick) => boolean) {
  const calls: ShapePick[] = [];
  const timer = (pick: ShapePick) => {
    calls.push(pick);
    return Promise.resolve(fast(pick) ? 1e-4 - pick.slices * 1e-7 : 1e-3 + calls.length * 1e-6);
  };
  return { timer, calls };
}

/** Runs `fn` as a GPU with no picks in memory or in this profile's cache, and clears them after. */
function freshGpu(fn: () => Promise<void>): Promise<void> {
  return asGpu(async () => {
    const clear = () => {
      forgetMatmulShapes(gpu);
      tuningStore().removeItem(shapeCacheKey(gpu));
    };
    clear();
    try {
      await fn();
    } finally {
      clear();
    }
  });
}

/** Kernel keys and grids of the matmul dispatches `fn` records. */
async function dispatched(fn: () => Promise<void>) {
  const seen: { key: string; z: number }[] = [];
  const dispatch = gpu.dispatch;
  gpu.dispatch = (kernel, buffers, uniforms, workgroups, cost) => {
    if (kernel.key.startsWith("matmul{")) seen.push({ key: kernel.key, z: workgroups[2] ?? 1 });
    dispatch.call(gpu, kernel, buffers, uniforms, workgroups, cost);
  };
  try {
    await fn();
  } finally {
    gpu.dispatch = dispatch;
  }
  return seen;
}

/** Whether a matmul kernel key was built from `tiling`. */
function keyHas(key: string, tiling: MatmulTiling): boolean {
  return Object.entries(tiling).every(([name, value]) => key.includes(`${name}=${value}`));
}

/** x·Wᵀ of `shape` through `matmul`, against f64. */
async function checkAgainstF64(shape: MatmulShape, seed: number): Promise<void> {
  const { m, n, k } = shape;
  const x = uniform(m * k, seed), w = uniform(n * k, seed + 1);
  const tx = Tensor.from(x, [m, k]), tw = Tensor.from(w, [n, k]);
  const y = matmul(tx, tw, { transB: true });
  const expected = matmul64(x, w, { batch: 1, m, n, k, transA: false, transB: true });
  const tol = { atol: TOL.f32.atol * Math.sqrt(k) / 4, rtol: TOL.f32.rtol };
  assertClose(await y.read(), expected, tol, matmulShapeKey(shape));
  [tx, tw, y].forEach((t) => t.dispose());
}

Deno.test({
  name: "shape tuning: two shapes of one class get their own picks (one split into whole " +
    "waves), dispatch runs each shape's pick, and results match f64",
  ...GPU_TEST,
  async fn() {
    await freshGpu(async () => {
      const tilings = gpuTilings();
      assert.ok(tilings.length >= 2, "at least two GPU tilings fit lavapipe");
      const [first, last] = [tilings[0], tilings[tilings.length - 1]];
      // The long product: the last tiling split is fastest; the short one: the first, unsplit.
      const long = favouring((p) => p.tiling === last && p.slices > 1);
      const short = favouring((p) => p.tiling === first && p.slices === 1);
      const [l] = await tuneMatmulShapes(gpu, { shapes: [LONG], timer: long.timer, cache: true });
      const [s] = await tuneMatmulShapes(gpu, { shapes: [SHORT], timer: short.timer, cache: true });
      assert.equal(l.pick.tiling, last);
      assert.ok(l.pick.slices > 1, `long product split (${l.pick.slices} slices)`);
      assert.ok(
        waveSlices(gpu, last, LONG, 1, 3).includes(l.pick.slices),
        "the slice count is one of the whole-wave counts",
      );
      assert.deepEqual(s.pick, { tiling: first, slices: 1 });
      assert.equal(l.trials, long.calls.length);
      assert.ok(!l.cached && !s.cached);
      const seen = await dispatched(async () => {
        await checkAgainstF64(LONG, 11);
        await checkAgainstF64(SHORT, 13);
      });
      assert.equal(seen.length, 2, JSON.stringify(seen));
      assert.ok(keyHas(seen[0].key, last), `long product ran ${seen[0].key}`);
      assert.equal(seen[0].z, l.pick.slices, "one grid layer per slice");
      assert.ok(keyHas(seen[1].key, first), `short product ran ${seen[1].key}`);
      assert.equal(seen[1].z, 1);
      assert.deepEqual(
        matmulShapeReport(gpu).map((r) => [r.key, r.pick]),
        [[matmulShapeKey(LONG), l.pick], [matmulShapeKey(SHORT), s.pick]],
      );
    });
  },
});

Deno.test({
  name: "shape tuning: a shape dispatched before tuning runs its class's tiling, is noted, " +
    "and tuneMatmulShapes() then tunes it; a second run reads the cache and does not re-tune",
  ...GPU_TEST,
  async fn() {
    await freshGpu(async () => {
      const last = gpuTilings().at(-1)!;
      const before = await dispatched(() => checkAgainstF64(SHORT, 3));
      assert.ok(!keyHas(before[0].key, last), "untuned: the class's tiling");
      const first = favouring((p) => p.tiling === last);
      const tuned = await tuneMatmulShapes(gpu, { timer: first.timer, cache: true });
      assert.equal(tuned[0].pick.tiling, last);
      assert.deepEqual(tuned.map((t) => t.key), [matmulShapeKey(SHORT)], "the noted shape");
      assert.ok(tuned[0].trials > 0 && tuned[0].trials <= SHAPE_TRIAL_BUDGET);
      const calls = first.calls.length;
      const again = await tuneMatmulShapes(gpu, { timer: first.timer });
      assert.equal(first.calls.length, calls, "a shape with a pick is not timed again");
      assert.deepEqual(again.map((t) => [t.key, t.trials, t.cached]), [[tuned[0].key, 0, false]]);

      forgetMatmulShapes(gpu); // a new run: only the cache remains
      const after = await dispatched(() => checkAgainstF64(SHORT, 5));
      assert.ok(keyHas(after[0].key, last), "the cached pick runs before any tuning");
      const second = favouring(() => true);
      const read = await tuneMatmulShapes(gpu, { timer: second.timer });
      assert.equal(second.calls.length, 0, "nothing timed");
      assert.ok(read[0].cached && read[0].trials === 0);
      assert.deepEqual(read[0].pick, tuned[0].pick);
      assert.equal(read[0].seconds, tuned[0].seconds, "the cache keeps the pick's time");
      // force measures what the cache gave again (a benchmark's --retune).
      const [retuned] = await tuneMatmulShapes(gpu, { timer: second.timer, force: true });
      assert.ok(second.calls.length > 0 && !retuned.cached);
    });
  },
});

Deno.test({
  name: "shape tuning: a cache written on another adapter, and malformed entries, are ignored",
  ...GPU_TEST,
  async fn() {
    await freshGpu(async () => {
      const good = favouring((p) => p.slices === 1);
      await tuneMatmulShapes(gpu, { shapes: [SHORT], timer: good.timer, cache: true });
      const key = shapeCacheKey(gpu), entryKey = matmulShapeKey(SHORT);
      const stored = JSON.parse(tuningStore().getItem(key)!);
      const entry = stored[entryKey];
      assert.ok(entry, "the pick was cached");
      const epilogue = { ...SHORT, bias: "f32" };
      const bad: Record<string, unknown> = {
        "another adapter": { ...entry, adapter: "Some Other GPU [gpu-like]" },
        "an unknown tiling": { ...entry, pick: { ...entry.pick, tiling: { variant: "vec4" } } },
        "a CPU tiling": {
          ...entry,
          pick: {
            ...entry.pick,
            tiling: matmulCandidates(gpu, "f32").find((t) => !tilingKind(t).forGpus),
          },
        },
        "zero slices": { ...entry, pick: { ...entry.pick, slices: 0 } },
        "fractional slices": { ...entry, pick: { ...entry.pick, slices: 1.5 } },
        "more slices than k steps": { ...entry, pick: { ...entry.pick, slices: 64 } },
        "no time": { ...entry, seconds: -1 },
        "not an object": "vec4",
        "another shape's entry": { ...entry, shape: { ...entry.shape, k: 2048 } },
        "a split with an epilogue": {
          ...entry,
          shape: epilogue,
          pick: { ...entry.pick, slices: 2 },
        },
      };
      for (const [what, value] of Object.entries(bad)) {
        const entryAt = what === "a split with an epilogue"
          ? matmulShapeKey(epilogue as MatmulShape)
          : entryKey;
        tuningStore().setItem(key, JSON.stringify({ [entryAt]: value }));
        forgetMatmulShapes(gpu);
        assert.deepEqual(matmulShapeReport(gpu), [], `${what}: not trusted`);
      }
      tuningStore().setItem(key, "{not json");
      forgetMatmulShapes(gpu);
      const timed = favouring(() => true);
      const [result] = await tuneMatmulShapes(gpu, { shapes: [SHORT], timer: timed.timer });
      assert.ok(timed.calls.length > 0 && !result.cached, "a corrupt cache: measured again");
      // The good entry itself is trusted (so the cases above fail for their own reason).
      tuningStore().setItem(key, JSON.stringify(stored));
      forgetMatmulShapes(gpu);
      assert.equal(matmulShapeReport(gpu).length, 1);
    });
  },
});

/** The real GPT's products (nanoGPT shakespeare-char: B·T = 16384, dim 384, vocab 65). */
function gptShapes(): MatmulShape[] {
  const tokens = 64 * 256, out: MatmulShape[] = [];
  const base = { batch: 1, dtype: "f32", out: "f32", bias: "none", activation: "none" } as const;
  for (const [inner, outer] of [[384, 1152], [384, 384], [384, 1536], [1536, 384], [384, 65]]) {
    const activation = outer === 1536 ? "gelu" : "none";
    out.push({
      ...base,
      m: tokens,
      n: outer,
      k: inner,
      orientation: "nt",
      bias: "f32",
      activation,
    });
    out.push({ ...base, m: tokens, n: inner, k: outer, orientation: "nn" });
    out.push({ ...base, m: outer, n: inner, k: tokens, orientation: "tn" });
  }
  return out;
}

Deno.test({
  name: "shape tuning: budget — the GPT's 15 products take at most SHAPE_TRIAL_BUDGET timings " +
    "each, weight gradients try whole-wave split counts, and products with an epilogue never split",
  ...GPU_TEST,
  async fn() {
    await freshGpu(async () => {
      const shapes = gptShapes();
      const { timer, calls } = favouring(() => false);
      const results = await tuneMatmulShapes(gpu, { shapes, timer });
      assert.equal(results.length, 15);
      for (const r of results) assert.ok(r.trials <= SHAPE_TRIAL_BUDGET, `${r.key}: ${r.trials}`);
      assert.equal(calls.length, results.reduce((s, r) => s + r.trials, 0));
      // A timing waits for the GPU about twice (~25 ms on an H100): this bounds tuning at ~6 s.
      assert.ok(calls.length * 0.025 <= 6.5, `${calls.length} timings`);
      const splits = (i: number) => calls.slice(...range(results, i)).map((p) => p.slices);
      // fc1's weight gradient gᵀ·x (1536 × 384 over 16384 tokens) tries split counts.
      const fc1Grad = results.findIndex(({ shape: s }) =>
        s.orientation === "tn" && s.m === 1536 && s.n === 384 && s.k === 16384
      );
      assert.ok(splits(fc1Grad).some((s) => s > 1), `${splits(fc1Grad)}`);
      for (const [i, r] of results.entries()) {
        if (r.shape.bias !== "none") assert.ok(splits(i).every((s) => s === 1), r.key);
      }
    });
  },
});

/** The index range of shape `i`'s timings in the timer's calls. */
function range(results: { trials: number }[], i: number): [number, number] {
  const start = results.slice(0, i).reduce((s, r) => s + r.trials, 0);
  return [start, start + results[i].trials];
}

Deno.test({
  name: "shape tuning: CPU adapters keep the class rule (nothing noted, nothing tuned)",
  ...GPU_TEST,
  async fn() {
    assert.ok(gpu.adapterProfile.cpu, "tests run on lavapipe");
    const seen = await dispatched(() => checkAgainstF64(SHORT, 7));
    assert.equal(seen.length, 1);
    assert.deepEqual(matmulShapeReport(gpu), []);
    assert.deepEqual(await tuneMatmulShapes(gpu, { shapes: [SHORT] }), []);
  },
});

Deno.test({
  name: "shape tuning: every trial runs on the device (batched split, f16 with a bias and " +
    "GELU) without a device error",
  ...GPU_TEST,
  async fn() {
    await freshGpu(async () => {
      const shapes: MatmulShape[] = [
        { ...SHORT, m: 33, n: 7, batch: 2, orientation: "tn" },
        { ...SHORT, m: 9, n: 12, k: 300, dtype: "f16", bias: "f16", activation: "gelu" },
      ];
      let runs = 0;
      const timer = async (_: ShapePick, run: () => void) => {
        run();
        runs++;
        await gpu.sync();
        return 1e-3;
      };
      const results = await tuneMatmulShapes(gpu, { shapes, timer });
      assert.equal(runs, results[0].trials + results[1].trials);
      assert.ok(results[0].trials > gpuTilings().length, "split counts tried too");
    });
  },
});
