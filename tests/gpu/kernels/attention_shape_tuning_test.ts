/**
 * Per-shape attention tuning on GPUs (gpu/kernels/attention/settings.ts,
 * `tuneAttentionShapes`), through the GPU-like adapter profile and injected
 * timers: each (B·H, T, D, dtype) gets its own plan, the kernels run it and
 * still match f64, the tuner runs the real B·H, picks are cached per
 * adapter, and another adapter's or a malformed cache entry is ignored.
 */
import assert from "node:assert/strict";
import { tuningStore } from "../../helpers/internals.ts";
import {
  attentionSettings,
  type AttentionShape,
  attentionShapeReport,
  backward,
  fusedCausalAttention,
  Tensor,
  tuneAttentionShapes,
} from "../../../gpu/mod.ts";
import type { AttentionPlan } from "../../../gpu/kernels/attention/plans.ts";
import {
  attentionShapeCacheKey,
  attentionShapeKey,
} from "../../../gpu/kernels/attention/settings.ts";
import { attentionPlanCandidates } from "../../../gpu/kernels/attention/flash_attention.ts";
import { asGpu, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import {
  type AttentionDims,
  causalAttentionWithGrads64,
} from "../../helpers/attention_reference.ts";
import { uniform } from "../../helpers/reference.ts";
import { assertClose } from "../../helpers/assert.ts";

/** Two problems of one head size and length that differ only in B·H (4 and 6 heads in all). */
const FOUR: AttentionDims = { b: 2, h: 2, t: 9, d: 16 };
const SIX: AttentionDims = { b: 3, h: 2, t: 9, d: 16 };
const shapeOf = (dims: AttentionDims): AttentionShape => ({
  heads: dims.b * dims.h,
  t: dims.t,
  headSize: dims.d,
  dtype: "f32",
});

/** A timer that says plans matching `fast` are fastest, and counts its calls. */
function favouring(fast: (plan: AttentionPlan) => boolean) {
  const calls: AttentionPlan[] = [];
  const timer = (plan: AttentionPlan) => {
    calls.push(plan);
    return Promise.resolve(fast(plan) ? 1e-4 : 1e-3 + calls.length * 1e-6);
  };
  return { timer, calls };
}

/** Runs `fn` as a GPU with no attention picks in memory or in this profile's cache, and clears them after. */
function freshGpu(fn: () => Promise<void>): Promise<void> {
  return asGpu(async () => {
    const clear = () => {
      attentionSettings.reset(gpu);
      tuningStore().removeItem(attentionShapeCacheKey(gpu));
    };
    clear();
    try {
      await fn();
    } finally {
      clear();
    }
  });
}

/** Attention forward and backward of `dims` on the GPU against f64; the attention kernels' keys. */
async function checkAgainstF64(dims: AttentionDims, seed: number): Promise<string[]> {
  const n = dims.b * dims.t * dims.h * dims.d, shape = [dims.b, dims.t, dims.h * dims.d];
  const [q, k, v, g] = [1, 2, 3, 4].map((s) => uniform(n, seed + s));
  const expected = causalAttentionWithGrads64(q, k, v, g, dims);
  const tensors = [q, k, v].map((a) => Tensor.from(a, shape, { requiresGrad: true }));
  const grad = Tensor.from(g, shape);
  const keys: string[] = [];
  const dispatch = gpu.dispatch;
  gpu.dispatch = (kernel, ...rest) => {
    if (kernel.key.startsWith("flash_attention")) keys.push(kernel.key);
    dispatch.call(gpu, kernel, ...rest);
  };
  let o: Tensor;
  try {
    o = fusedCausalAttention(tensors[0], tensors[1], tensors[2], { heads: dims.h });
    backward(o, { gradient: grad });
  } finally {
    gpu.dispatch = dispatch;
  }
  const tol = { atol: 2e-5, rtol: 2e-4 };
  assertClose(await o.read(), expected.o, tol, "o");
  for (const [i, name] of (["dq", "dk", "dv"] as const).entries()) {
    assertClose(await tensors[i].grad!.read(), expected[name], tol, name);
  }
  [...tensors, grad, o].forEach((t) => t.dispose());
  return keys;
}

const tiled = (p: AttentionPlan) => p.tile !== undefined;
/** Whether kernel keys come from a tiled plan (the tiled kernels) or a row plan. */
const ranTiled = (keys: string[]) => keys.some((k) => k.startsWith("flash_attention_tiled"));

Deno.test({
  name: "attention shape tuning: two B·H of one T and D get their own plans, the kernels run " +
    "each shape's plan and match f64",
  ...GPU_TEST,
  async fn() {
    await freshGpu(async () => {
      const candidates = attentionPlanCandidates(gpu, 16);
      assert.ok(candidates.some(tiled) && candidates.some((p) => !tiled(p)));
      const four = favouring(tiled), six = favouring((p) => !tiled(p) && p.rows === 16);
      const [a] = await tuneAttentionShapes(gpu, { shapes: [shapeOf(FOUR)], timer: four.timer });
      const [b] = await tuneAttentionShapes(gpu, { shapes: [shapeOf(SIX)], timer: six.timer });
      assert.ok(tiled(a.plan) && !tiled(b.plan), JSON.stringify([a.plan, b.plan]));
      assert.equal(a.key, attentionShapeKey(shapeOf(FOUR)));
      assert.equal(a.trials, four.calls.length);
      assert.equal(a.trials, candidates.length + 3, "every candidate, then three finalists");
      assert.ok(ranTiled(await checkAgainstF64(FOUR, 1)), "B·H 4 runs its tiled pick");
      assert.ok(!ranTiled(await checkAgainstF64(SIX, 2)), "B·H 6 runs its row pick");
      assert.deepEqual(
        attentionShapeReport(gpu).map((r) => [r.key, r.plan]),
        [[a.key, a.plan], [b.key, b.plan]],
      );
    });
  },
});

Deno.test({
  name: "attention shape tuning: a shape run before tuning is noted and tuned at its real B·H; " +
    "a second run reads the cache and does not re-tune",
  ...GPU_TEST,
  async fn() {
    await freshGpu(async () => {
      assert.ok(!ranTiled(await checkAgainstF64(SIX, 3)), "untuned: the dtype's plan (rows)");
      // The timer runs the first row plan and the first tiled plan (lavapipe compiles each in
      // seconds): every attention kernel of theirs covers all 6 heads.
      const grids: number[] = [];
      const first = favouring(tiled);
      const ran = new Set<boolean>();
      const timer = async (plan: AttentionPlan, run: () => void) => {
        if (ran.has(tiled(plan))) return first.timer(plan);
        ran.add(tiled(plan));
        const dispatch = gpu.dispatch;
        gpu.dispatch = (kernel, buffers, uniforms, workgroups, cost) => {
          if (kernel.key.startsWith("flash_attention")) {
            grids.push(workgroups[0] * (workgroups[1] ?? 1) * (workgroups[2] ?? 1));
          }
          dispatch.call(gpu, kernel, buffers, uniforms, workgroups, cost);
        };
        try {
          run();
        } finally {
          gpu.dispatch = dispatch;
        }
        await gpu.sync();
        return first.timer(plan);
      };
      const tuned = await tuneAttentionShapes(gpu, { timer, cache: true });
      assert.deepEqual(tuned.map((t) => t.key), [attentionShapeKey(shapeOf(SIX))], "the noted one");
      assert.ok(tiled(tuned[0].plan));
      // T = 9 is one block of every plan: a workgroup per head and pass, B·H = 6 of them.
      assert.equal(ran.size, 2, "a row plan and a tiled plan ran");
      assert.ok(grids.length > 0 && grids.every((w) => w === 6), `grids ${grids}`);
      const calls = first.calls.length;
      const again = await tuneAttentionShapes(gpu, { timer: first.timer });
      assert.equal(first.calls.length, calls, "a shape with a pick is not timed again");
      assert.deepEqual(again.map((t) => [t.trials, t.cached]), [[0, false]]);

      attentionSettings.reset(gpu); // a new run: only the cache remains
      assert.ok(ranTiled(await checkAgainstF64(SIX, 4)), "the cached pick runs before tuning");
      const second = favouring(() => true);
      const [read] = await tuneAttentionShapes(gpu, { timer: second.timer });
      assert.equal(second.calls.length, 0, "nothing timed");
      assert.ok(read.cached && read.trials === 0);
      assert.deepEqual(read.plan, tuned[0].plan);
      assert.equal(read.seconds, tuned[0].seconds, "the cache keeps the pick's time");
      const [retuned] = await tuneAttentionShapes(gpu, { timer: second.timer, force: true });
      assert.ok(second.calls.length > 0 && !retuned.cached, "force measures it again");
    });
  },
});

Deno.test({
  name: "attention shape tuning: a cache written on another adapter, and malformed entries, " +
    "are ignored; CPU adapters tune nothing",
  ...GPU_TEST,
  async fn() {
    await freshGpu(async () => {
      const shape = shapeOf(FOUR);
      await tuneAttentionShapes(gpu, {
        shapes: [shape],
        timer: favouring(tiled).timer,
        cache: true,
      });
      const key = attentionShapeCacheKey(gpu), entryKey = attentionShapeKey(shape);
      const stored = JSON.parse(tuningStore().getItem(key)!);
      const entry = stored[entryKey];
      assert.ok(entry, "the pick was cached");
      const bad: Record<string, unknown> = {
        "another adapter": { ...entry, adapter: "Some Other GPU [gpu-like]" },
        "an unknown plan": { ...entry, plan: { rows: 48, stage: 0 } },
        "a tile past the memory limit": {
          ...entry,
          plan: { rows: 64, stage: 0, tile: { br: 4096, bc: 4096, rm: 1, rn: 1 } },
        },
        "no time": { ...entry, seconds: 0 },
        "zero heads": { ...entry, shape: { ...entry.shape, heads: 0 } },
        "an integer dtype": { ...entry, shape: { ...entry.shape, dtype: "i32" } },
        "not an object": "tiled",
        "another shape's entry": { ...entry, shape: { ...entry.shape, t: 10 } },
      };
      for (const [what, value] of Object.entries(bad)) {
        tuningStore().setItem(key, JSON.stringify({ [entryKey]: value }));
        attentionSettings.reset(gpu);
        assert.deepEqual(attentionShapeReport(gpu), [], `${what}: not trusted`);
      }
      tuningStore().setItem(key, "{not json");
      attentionSettings.reset(gpu);
      const timed = favouring(() => true);
      const [result] = await tuneAttentionShapes(gpu, { shapes: [shape], timer: timed.timer });
      assert.ok(timed.calls.length > 0 && !result.cached, "a corrupt cache: measured again");
      // The good entry itself is trusted (so the cases above fail for their own reason).
      tuningStore().setItem(key, JSON.stringify(stored));
      attentionSettings.reset(gpu);
      assert.equal(attentionShapeReport(gpu).length, 1);
    });
    if (gpu.adapterProfile.cpu) {
      const timed = favouring(() => true);
      const none = await tuneAttentionShapes(gpu, { shapes: [shapeOf(FOUR)], timer: timed.timer });
      assert.deepEqual([none.length, timed.calls.length], [0, 0], "the CPU adapter keeps its plan");
    }
  },
});
