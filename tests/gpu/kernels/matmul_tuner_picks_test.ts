/**
 * The matmul tuners by what they do, not by their key strings: products that
 * differ in one thing only — the dtype, the orientation, the batch, the
 * epilogue, the size class — and one product under two adapter profiles are
 * each tuned with a timer under which another candidate wins. Each must then
 * run its own pick (as dispatch finds it: `tilingFor` for classes,
 * `shapePickFor` for exact shapes, from a problem laid out as `matmul` lays
 * it), and a second run must take every pick from the cache without calling
 * its timer again. A key that forgot any of these would give two products
 * one pick. The cache is a store in memory (tests/helpers/tuning.ts).
 */
import assert from "node:assert/strict";
import {
  type MatmulClass,
  type MatmulShape,
  type MatmulTiling,
  type ShapePick,
  tilingFor,
  tuneMatmul,
  tuneMatmulShapes,
} from "../../../gpu/mod.ts";
import { withAdapterProfile } from "../../helpers/internals.ts";
import { denseProblem } from "../../../gpu/kernels/gemm/matmul_class.ts";
import {
  forgetMatmulShapes,
  shapeOf,
  shapePickFor,
} from "../../../gpu/kernels/gemm/shape_picks.ts";
import { matmulCandidates } from "../../../gpu/kernels/gemm/candidates.ts";
import { matmulSettings } from "../../../gpu/kernels/gemm/settings.ts";
import { tilingKind, tilingName } from "../../../gpu/kernels/gemm/tilings.ts";
import { asGpu, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { favouring, twoProfiles, withMemoryStore } from "../../helpers/tuning.ts";

/** A product too short in k to split (each slice sums at least 256): every pick has one slice. */
const BASE: MatmulShape = {
  m: 48,
  n: 40,
  k: 200,
  batch: 1,
  orientation: "nt",
  dtype: "f32",
  out: "f32",
  bias: "none",
  activation: "none",
};

/** BASE and products that differ from it in one field each. */
function shapeVariants(): [string, MatmulShape][] {
  const variants: [string, Partial<MatmulShape>][] = [
    ["base", {}],
    ["bf16 operands and result", { dtype: "bf16", out: "bf16" }],
    ["a bf16 result", { out: "bf16" }],
    ["orientation A·B", { orientation: "nn" }],
    ["orientation Aᵀ·B", { orientation: "tn" }],
    ["a batch of 3", { batch: 3 }],
    ["a bias", { bias: "f32" }],
    ["a ReLU", { activation: "relu" }],
  ];
  if (gpu.f16) variants.push(["f16 operands and result", { dtype: "f16", out: "f16" }]);
  return variants.map(([what, change]) => [what, { ...BASE, ...change }]);
}

/** The per-shape pick dispatch finds for `s`: from a problem laid out as `matmul` lays it. */
function dispatchedPick(s: MatmulShape): ShapePick | undefined {
  const problem = denseProblem(s, s.orientation);
  return shapePickFor(
    gpu,
    problem,
    () =>
      shapeOf(problem, { dtype: s.dtype, out: s.out }, { bias: s.bias, activation: s.activation }),
  );
}

/** The GPU tilings a shape of BASE's dtype is tuned with under the current profile. */
const gpuTilings = () => matmulCandidates(gpu, "f32").filter((t) => tilingKind(t).forGpus);

Deno.test({
  name: "matmul shape tuner: products that differ only in dtype, orientation, batch or " +
    "epilogue each run their own pick, and a second run takes them from the cache untimed",
  ...GPU_TEST,
  fn: () =>
    withMemoryStore(() =>
      asGpu(async () => {
        const tilings = gpuTilings();
        assert.ok(tilings.length >= 2, "two GPU tilings to choose between");
        const products = shapeVariants().map(([what, shape], i) => {
          // BASE wins with the first tiling, every other product with another one.
          const winner = tilings[i === 0 ? 0 : 1 + (i - 1) % (tilings.length - 1)];
          return { what, shape, winner, ...favouring((p: ShapePick) => p.tiling === winner) };
        });
        for (const p of products) {
          const [tuned] = await tuneMatmulShapes(gpu, {
            shapes: [p.shape],
            timer: p.timer,
            cache: true,
          });
          assert.ok(p.calls.length > 0 && !tuned.cached, `${p.what}: timed`);
          assert.deepEqual(tuned.pick, { tiling: p.winner, slices: 1 }, p.what);
        }
        const own = (what: string) => {
          for (const p of products) {
            assert.deepEqual(
              dispatchedPick(p.shape),
              { tiling: p.winner, slices: 1 },
              `${what}: ${p.what}`,
            );
          }
        };
        own("this run");
        forgetMatmulShapes(gpu); // a new run: only the cache remains
        own("from the cache");
        for (const p of products) {
          const timed = p.calls.length;
          const [again] = await tuneMatmulShapes(gpu, { shapes: [p.shape], timer: p.timer });
          assert.equal(p.calls.length, timed, `${p.what}: not timed again`);
          assert.ok(again.cached && again.trials === 0, p.what);
          assert.deepEqual(again.pick.tiling, p.winner, p.what);
        }
      })
    ),
});

/** The tiling dispatch runs for a product of class `c` (not the class's own problem). */
function dispatchedTiling(c: MatmulClass): MatmulTiling {
  const dims = c.size === "small" ? { m: 8, n: 16, k: 32 } : { m: 128, n: 256, k: 512 };
  return tilingFor(gpu, denseProblem({ batch: 1, ...dims }, c.orientation), c.dtype);
}

Deno.test({
  name: "matmul class tuner: classes that differ only in dtype, orientation or size each " +
    "dispatch their own winner, and a second run takes them from the cache untimed",
  ...GPU_TEST,
  fn: () =>
    withMemoryStore(() =>
      asGpu(async () => {
        const base: MatmulClass = { dtype: "f32", orientation: "nt", size: "small" };
        const classes: MatmulClass[] = [
          base,
          { ...base, dtype: "bf16" },
          ...(gpu.f16 ? [{ ...base, dtype: "f16" } as const] : []),
          { ...base, orientation: "nn" },
          { ...base, orientation: "tn" },
          { ...base, size: "medium" },
        ];
        const runs = classes.map((c, i) => {
          const candidates = matmulCandidates(gpu, c.dtype);
          const winner = candidates[(3 * i + 1) % candidates.length];
          return { c, winner, ...favouring((t: MatmulTiling) => t === winner) };
        });
        assert.equal(new Set(runs.map((r) => r.winner)).size, runs.length, "winners all differ");
        for (const r of runs) {
          const [tuned] = await tuneMatmul(gpu, { classes: [r.c], timer: r.timer, cache: true });
          assert.equal(tuned.best, r.winner, JSON.stringify(r.c));
          assert.ok(!tuned.cached && r.calls.length > 0);
        }
        const label = (r: typeof runs[number]) => `${JSON.stringify(r.c)} ${tilingName(r.winner)}`;
        for (const r of runs) assert.equal(dispatchedTiling(r.c), r.winner, label(r));
        matmulSettings.of(gpu).classTilings.clear(); // a new run: only the cache remains
        for (const r of runs) {
          const timed = r.calls.length;
          const [again] = await tuneMatmul(gpu, { classes: [r.c], timer: r.timer, cache: true });
          assert.equal(r.calls.length, timed, `${label(r)}: not timed again`);
          assert.ok(again.cached && again.best === r.winner, label(r));
        }
        for (const r of runs) assert.equal(dispatchedTiling(r.c), r.winner, `cached ${label(r)}`);
      })
    ),
});

Deno.test({
  name: "matmul tuners: one product under two adapter profiles gets each profile's own pick, " +
    "class and shape, and each profile's second run takes its own from the cache untimed",
  ...GPU_TEST,
  fn: () =>
    withMemoryStore(async () => {
      const c: MatmulClass = { dtype: "f32", orientation: "nt", size: "small" };
      const profiles = twoProfiles();
      const under = <T>(i: number, fn: () => Promise<T>) =>
        withAdapterProfile(gpu, profiles[i], fn);
      // The profiles offer different candidates: one wins with the first, the other the last.
      const winners: { tiling: MatmulTiling; shape: MatmulTiling }[] = [];
      for (const i of [0, 1]) {
        const pickFrom = <T>(list: readonly T[]) => i === 0 ? list[0] : list[list.length - 1];
        await under(i, () =>
          Promise.resolve(winners.push({
            tiling: pickFrom(matmulCandidates(gpu, "f32")),
            shape: pickFrom(gpuTilings()),
          })));
      }
      assert.notEqual(winners[0].tiling, winners[1].tiling);
      assert.notEqual(winners[0].shape, winners[1].shape);
      const timers = winners.map((w) => ({
        class: favouring((t: MatmulTiling) => t === w.tiling),
        shape: favouring((p: ShapePick) => p.tiling === w.shape),
      }));
      // Both tuners on the one product, each with profile i's timer, reading and writing the cache.
      const tuneBoth = async (i: number) => {
        const timer = timers[i];
        const [tuned] = await tuneMatmul(gpu, {
          classes: [c],
          timer: timer.class.timer,
          cache: true,
        });
        const [shape] = await tuneMatmulShapes(gpu, {
          shapes: [BASE],
          timer: timer.shape.timer,
          cache: true,
        });
        return { tuned, shape, calls: [timer.class.calls.length, timer.shape.calls.length] };
      };
      for (const i of [0, 1]) {
        await under(i, async () => {
          const { tuned, shape } = await tuneBoth(i);
          assert.equal(tuned.best, winners[i].tiling, `profile ${i}: class`);
          assert.equal(shape.pick.tiling, winners[i].shape, `profile ${i}: shape`);
        });
      }
      // Each profile again, afresh (a new run on that adapter): its own picks, untimed.
      for (const i of [0, 1]) {
        await under(i, async () => {
          const before = [timers[i].class.calls.length, timers[i].shape.calls.length];
          const cachedShape = dispatchedPick(BASE)?.tiling;
          assert.equal(cachedShape, winners[i].shape, `profile ${i}: cached shape`);
          const { tuned, shape, calls } = await tuneBoth(i);
          assert.deepEqual(calls, before, `profile ${i}: not timed again`);
          assert.ok(tuned.cached && shape.cached, `profile ${i}: from the cache`);
          assert.equal(tuned.best, winners[i].tiling, `profile ${i}: cached class`);
          assert.equal(dispatchedTiling(c), winners[i].tiling, `profile ${i}: dispatched class`);
        });
      }
    }),
});
