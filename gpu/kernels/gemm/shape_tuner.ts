/**
 * Tunes matmuls at their own shapes on GPUs: every product shape a device
 * has dispatched (or that the caller lists) is timed with each GPU tiling,
 * and its best tilings again with split-K slice counts that fill whole
 * waves of the adapter's multiprocessors (`waveSlices`). The pick is kept
 * per device and cached per adapter (`shape_picks.ts`, which also says why
 * this runs between steps, never inside one).
 *
 * Budget: at most {@link SHAPE_TRIAL_BUDGET} timings per shape — each GPU
 * tiling once at its own shape (split to one wave where that helps), the two
 * fastest tilings with up to two more slice counts each, then the three
 * fastest trials again. Each timing waits for the GPU, so a model's shapes
 * take seconds to tune, once per adapter (the picks are cached).
 */
import type { MatmulTiling } from "./settings.ts";
import type { Gpu } from "../../device/gpu.ts";
import { launchMatmulInto } from "./matmul.ts";
import { denseProblem, type MatmulProblem } from "./matmul_class.ts";
import { DeviceArray } from "../../device/device_array.ts";
import { type CandidateTimer, retimeFinalists } from "../../tuning/timing.ts";
import { tilingKind } from "./tilings.ts";
import { waveSlices } from "./gemm.ts";
import { matmulCandidates } from "./candidates.ts";
import {
  MATMUL_SHAPE_STORE,
  MATMUL_SHAPE_TASK,
  type MatmulShape,
  type ShapePick,
  type ShapeRecord,
  shapeState,
} from "./shape_picks.ts";
import {
  type PickOutcome,
  pickReport,
  type ShapeTuningOptions,
  tuneShapes,
} from "../../tuning/picks.ts";

export type { MatmulShape, ShapePick } from "./shape_picks.ts";

/** Timings per shape at most (tilings, slice counts and finalists together). */
export const SHAPE_TRIAL_BUDGET = 16;

/** Tilings whose slice counts are tried, and slice counts per tiling. */
const SPLIT_TILINGS = 2, SPLIT_COUNTS = 2;
/** Trials timed again at the end, each keeping its better time. */
const FINALISTS = 3;

/** One shape's tuning: its pick, and its time where this run or the cache has one. */
export interface ShapeTuning {
  /** The shape. */
  shape: MatmulShape;
  /** Its key (`matmulShapeKey`). */
  key: string;
  /** What it runs with. */
  pick: ShapePick;
  /** Seconds per product of the pick (measured by this run, or when cached). */
  seconds: number;
  /** GFLOP/s of the pick: 2·batch·m·n·k over `seconds`. */
  gflops: number;
  /** Timings this run made for it (0 when cached). */
  trials: number;
  /** True when the pick came from the per-adapter cache. */
  cached: boolean;
}

/** Options of {@link tuneMatmulShapes}. */
export type TuneMatmulShapesOptions = ShapeTuningOptions<MatmulShape, ShapePick>;

/**
 * Tunes matmuls at their own shapes (see the module comment) and returns
 * the pick of every shape asked for (by default those dispatched so far;
 * only shapes without a pick are timed, unless `force`). On CPU adapters it does nothing and
 * returns none: dispatch keeps the class rule there. Waits for the GPU many
 * times: call it between steps (typically after the first), never in one.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, matmul, Tensor, tuneMatmulShapes } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const a = Tensor.full([64, 32], 1), b = Tensor.full([32, 48], 1);
 * matmul(a, b).dispose(); // a first step: runs with the class's tiling
 * const picks = await tuneMatmulShapes(gpu);
 * assert.equal(picks.length, gpu.adapterProfile.cpu ? 0 : 1);
 * gpu.destroy();
 * ```
 */
export async function tuneMatmulShapes(
  gpu: Gpu,
  options: TuneMatmulShapesOptions = {},
): Promise<ShapeTuning[]> {
  if (gpu.adapterProfile.cpu) return [];
  const outcomes = await tuneShapes(
    gpu,
    shapeState(gpu),
    MATMUL_SHAPE_STORE,
    MATMUL_SHAPE_TASK,
    options,
    (shape) => denseProblem(shape, shape.orientation),
    async (shape, problem, timer) => {
      const timed = await tuneShape(gpu, shape, problem, timer);
      return { record: { shape, pick: timed.pick, seconds: timed.seconds }, trials: timed.trials };
    },
  );
  return outcomes.map(shapeTuning);
}

/** An outcome as the report's row, with GFLOP/s: 2·batch·m·n·k over the pick's time. */
function shapeTuning({ key, record, trials, cached }: PickOutcome<ShapeRecord>): ShapeTuning {
  const { shape, pick, seconds } = record;
  const flops = 2 * shape.batch * shape.m * shape.n * shape.k;
  return { shape, key, pick, seconds, gflops: flops / seconds / 1e9, trials, cached };
}

/**
 * Every per-shape pick `gpu` holds, with its time: the report the benchmark
 * prints (shape → pick → time). Empty on CPU adapters.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, matmulShapeReport } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.ok(Array.isArray(matmulShapeReport(gpu)));
 * gpu.destroy();
 * ```
 */
export function matmulShapeReport(gpu: Gpu): ShapeTuning[] {
  if (gpu.adapterProfile.cpu) return [];
  return pickReport(shapeState(gpu)).map(shapeTuning);
}

/** The trials of one shape, in the order of the budget (module comment). */
async function tuneShape(
  gpu: Gpu,
  shape: MatmulShape,
  problem: MatmulProblem,
  timer: CandidateTimer<ShapePick>,
): Promise<{ pick: ShapePick; seconds: number; trials: number }> {
  const splittable = shape.bias === "none" && shape.activation === "none";
  const slicesOf = (tiling: MatmulTiling) =>
    splittable ? waveSlices(gpu, tiling, shape, shape.batch, SPLIT_COUNTS + 1) : [];
  const tilings = matmulCandidates(gpu, shape.dtype).filter((t) => tilingKind(t).forGpus)
    .slice(0, SHAPE_TRIAL_BUDGET - SPLIT_TILINGS * SPLIT_COUNTS - FINALISTS);
  // Made at the first run (an injected timer may time without running).
  let operands: ReturnType<typeof operandsOf> | undefined;
  const picks: ShapePick[] = [], seconds: number[] = [];
  const timeOf = (pick: ShapePick) =>
    timer(pick, () => {
      const o = operands ??= operandsOf(gpu, shape, problem);
      launchMatmulInto(problem, o.a, o.b, o.c, o.epilogue, pick);
    });
  const time = async (pick: ShapePick) => {
    picks.push(pick);
    seconds.push(await timeOf(pick));
  };
  let again = 0;
  try {
    for (const tiling of tilings) await time({ tiling, slices: slicesOf(tiling)[0] ?? 1 });
    const fastest = [...picks.keys()].sort((x, y) => seconds[x] - seconds[y])
      .slice(0, SPLIT_TILINGS).map((i) => picks[i]);
    for (const pick of fastest) {
      const others = [1, ...slicesOf(pick.tiling)].filter((s) => s !== pick.slices);
      for (const slices of others.slice(0, SPLIT_COUNTS)) await time({ ...pick, slices });
    }
    again = await retimeFinalists(seconds, (i) => timeOf(picks[i]), FINALISTS);
  } finally {
    for (const t of operands?.owned ?? []) t.dispose();
  }
  const best = seconds.reduce((b, x, i) => (x < seconds[b] ? i : b), 0);
  return { pick: picks[best], seconds: seconds[best], trials: picks.length + again };
}

/** Elements an operand laid out as `o` spans over `batch` × `rows` × `cols`. */
function extent(o: MatmulProblem["a"], batch: number, rows: number, cols: number): number {
  return (batch - 1) * o.batch + (rows - 1) * o.row + (cols - 1) * o.col + 1;
}

/** Scratch operands of `shape` laid out as `problem` (small values: no overflow in f16). */
function operandsOf(gpu: Gpu, shape: MatmulShape, problem: MatmulProblem) {
  const { batch, m, n, k } = shape;
  const a = DeviceArray.filled([extent(problem.a, batch, m, k)], 0.5, shape.dtype, gpu);
  const b = DeviceArray.filled([extent(problem.b, batch, k, n)], 0.25, shape.dtype, gpu);
  const c = DeviceArray.empty([batch * m * n], shape.out, gpu);
  const bias = shape.bias === "none" ? undefined : DeviceArray.filled([n], 0, shape.bias, gpu);
  return {
    a,
    b,
    c,
    epilogue: { bias, activation: shape.activation },
    owned: [a, b, c, ...(bias ? [bias] : [])],
  };
}
