/**
 * The attention tuners by what they do, not by their key strings: attention
 * shapes that differ in one thing only — B·H, T, D or the dtype — each dtype
 * of the start-up tuner, and one shape under two adapter profiles are each
 * tuned with a timer under which another plan wins. Each must then run its
 * own plan (as the kernels find it: `attentionPlanFor`), and a second run
 * must take every plan from the cache without calling its timer again. A
 * key that forgot any of these would give two shapes one plan. The cache
 * is a store in memory (tests/helpers/tuning.ts).
 */
import assert from "node:assert/strict";
import {
  type AttentionPlan,
  attentionSettings,
  type AttentionShape,
  type FloatDType,
  tuneAttention,
  tuneAttentionShapes,
} from "../../../gpu/mod.ts";
import { withAdapterProfile } from "../../helpers/internals.ts";
import { attentionPlanFor } from "../../../gpu/kernels/attention/settings.ts";
import { attentionPlanCandidates } from "../../../gpu/kernels/attention/plans.ts";
import { attentionTuningProblem } from "../../../gpu/kernels/attention/tuner.ts";
import { asGpu, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { favouring, twoProfiles, withMemoryStore } from "../../helpers/tuning.ts";

const BASE: AttentionShape = { heads: 4, t: 9, headSize: 16, dtype: "f32" };

/** BASE and shapes that differ from it in one field each. */
function shapeVariants(): [string, AttentionShape][] {
  const variants: [string, Partial<AttentionShape>][] = [
    ["base", {}],
    ["B·H 6", { heads: 6 }],
    ["T 17", { t: 17 }],
    ["D 8", { headSize: 8 }],
    ["bf16", { dtype: "bf16" }],
  ];
  if (gpu.f16) variants.push(["f16", { dtype: "f16" }]);
  return variants.map(([what, change]) => [what, { ...BASE, ...change }]);
}

/**
 * The plan the kernels run for `s`, as B = 1 × H = B·H and as B = B·H × H = 1:
 * a pick is for B·H, however it splits.
 */
function runPlans(s: AttentionShape): (AttentionPlan | undefined)[] {
  const { heads, t, headSize } = s;
  return [
    attentionPlanFor(gpu, s.dtype, { batch: 1, heads, t, headSize }),
    attentionPlanFor(gpu, s.dtype, { batch: heads, heads: 1, t, headSize }),
  ];
}

Deno.test({
  name: "attention shape tuner: shapes that differ only in B·H, T, D or dtype each run their " +
    "own plan, and a second run takes them from the cache untimed",
  ...GPU_TEST,
  fn: () =>
    withMemoryStore(() =>
      asGpu(async () => {
        const shapes = shapeVariants().map(([what, shape], i) => {
          const candidates = attentionPlanCandidates(gpu, shape.headSize);
          const winner = candidates[(5 * i + 2) % candidates.length];
          return { what, shape, winner, ...favouring((p: AttentionPlan) => p === winner) };
        });
        assert.equal(new Set(shapes.map((s) => s.winner)).size, shapes.length, "winners differ");
        for (const s of shapes) {
          const [tuned] = await tuneAttentionShapes(gpu, {
            shapes: [s.shape],
            timer: s.timer,
            cache: true,
          });
          assert.ok(s.calls.length > 0 && !tuned.cached, `${s.what}: timed`);
          assert.equal(tuned.plan, s.winner, s.what);
        }
        const own = (when: string) => {
          for (const s of shapes) {
            assert.deepEqual(runPlans(s.shape), [s.winner, s.winner], `${when}: ${s.what}`);
          }
        };
        own("this run");
        attentionSettings.reset(gpu); // a new run: only the cache remains
        own("from the cache");
        for (const s of shapes) {
          const timed = s.calls.length;
          const [again] = await tuneAttentionShapes(gpu, { shapes: [s.shape], timer: s.timer });
          assert.equal(s.calls.length, timed, `${s.what}: not timed again`);
          assert.ok(again.cached && again.trials === 0 && again.plan === s.winner, s.what);
        }
      })
    ),
});

Deno.test({
  name: "attention start-up tuner: each dtype runs its own plan, and a second run takes them " +
    "from the cache untimed",
  ...GPU_TEST,
  fn: () =>
    withMemoryStore(() =>
      asGpu(async () => {
        const dtypes: FloatDType[] = gpu.f16 ? ["f32", "f16", "bf16"] : ["f32", "bf16"];
        const { headSize } = attentionTuningProblem(gpu);
        // Each dtype's own (f16's add the subgroup-matrix pairings where the device has them).
        const candidates = dtypes.map((dtype) => attentionPlanCandidates(gpu, headSize, dtype));
        const winners = candidates.map((c, i) => c[(4 * i + 1) % c.length]);
        // The dtypes are timed one after another, each over its candidates and 3 finalists:
        // a call's index says whose turn it is.
        let timings = 0;
        const ends = candidates.map((c) => timings += c.length + 3);
        const calls: AttentionPlan[] = [];
        const timer = (plan: AttentionPlan) => {
          const winner = winners[ends.findIndex((end) => calls.length < end)];
          calls.push(plan);
          return Promise.resolve(plan === winner ? 1e-3 : 2e-3 + calls.length * 1e-6);
        };
        const tuned = await tuneAttention(gpu, { timer, cache: true });
        assert.equal(calls.length, timings);
        assert.deepEqual(
          tuned.map((t) => [t.dtype, t.best, t.cached]),
          dtypes.map((d, i) => [d, winners[i], false]),
        );
        // Untuned shapes run their dtype's plan.
        const own = (when: string) =>
          dtypes.forEach((dtype, i) =>
            assert.deepEqual(
              runPlans({ ...BASE, dtype }),
              [winners[i], winners[i]],
              `${when} ${dtype}`,
            )
          );
        own("this run");
        attentionSettings.reset(gpu); // a new run: only the cache remains
        const again = await tuneAttention(gpu, { timer, cache: true });
        assert.equal(calls.length, timings, "not timed again");
        assert.deepEqual(
          again.map((t) => [t.dtype, t.best, t.cached]),
          dtypes.map((d, i) => [d, winners[i], true]),
        );
        own("from the cache");
      })
    ),
});

Deno.test({
  name: "attention tuners: one shape under two adapter profiles gets each profile's own plan, " +
    "and each profile's second run takes its own from the cache untimed",
  ...GPU_TEST,
  fn: () =>
    withMemoryStore(async () => {
      const profiles = twoProfiles();
      const under = <T>(i: number, fn: () => Promise<T>) =>
        withAdapterProfile(gpu, profiles[i], fn);
      // The profiles offer different plans (tiles that fit 16 KiB or not): first and last.
      const winners: AttentionPlan[] = [];
      for (const i of [0, 1]) {
        await under(i, () => {
          const candidates = attentionPlanCandidates(gpu, BASE.headSize);
          return Promise.resolve(winners.push(candidates[i === 0 ? candidates.length - 1 : 0]));
        });
      }
      assert.notEqual(winners[0], winners[1]);
      const timers = winners.map((w) => favouring((p: AttentionPlan) => p === w));
      for (const i of [0, 1]) {
        await under(i, async () => {
          const [tuned] = await tuneAttentionShapes(gpu, {
            shapes: [BASE],
            timer: timers[i].timer,
            cache: true,
          });
          assert.equal(tuned.plan, winners[i], `profile ${i}`);
        });
      }
      // Each profile again, afresh (a new run on that adapter): its own plan, untimed.
      for (const i of [0, 1]) {
        await under(i, async () => {
          const timed = timers[i].calls.length;
          assert.deepEqual(runPlans(BASE), [winners[i], winners[i]], `profile ${i}: cached`);
          const [again] = await tuneAttentionShapes(gpu, {
            shapes: [BASE],
            timer: timers[i].timer,
          });
          assert.equal(timers[i].calls.length, timed, `profile ${i}: not timed again`);
          assert.ok(again.cached && again.plan === winners[i], `profile ${i}: from the cache`);
        });
      }
    }),
});
