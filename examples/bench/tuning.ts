/**
 * The benchmark's tuning and its report: what each matmul class and each
 * attention dtype picked at start-up, and each matmul and attention shape
 * `gpt` tuned after its first step (GPUs only), and how fast the pick ran on the
 * tuner's problem. `initGpu({ tuning: "eager" })` tunes the same way but keeps
 * only the winners, so the benchmark runs the tuners itself to keep their
 * measurements (a winner read from the per-adapter cache has none:
 * `--retune` measures again). Whatever else an entry runs untuned (on GPUs,
 * every product and attention at its own shape) is tuned in the entry's
 * warm-up, before it times (`holdTuningForBench`).
 */
import {
  type AttentionPlan,
  attentionShapeReport,
  type AttentionShapeTuning,
  type AttentionTuning,
  type ClassTuning,
  type Gpu,
  lazyTuning,
  matmulClassKey,
  matmulShapeReport,
  type ShapeTuning,
  tilingName,
  tuneAttention,
  tuneAttentionShapes,
  tuneMatmul,
  tuneMatmulShapes,
  type TuningProgress,
} from "../../gpu/mod.ts";

/** One tuned choice: what was picked for which key, and its time where it was measured. */
export interface TunedPick {
  /** Matmul class key (`"f32/nt/large"`), matmul shape key, attention storage dtype, or `attention` and an attention shape key. */
  key: string;
  /** The winner, as logs name it. */
  pick: string;
  /** Milliseconds per run of the winner on the tuner's problem (null when a cached class or plan). */
  ms: number | null;
  /** GFLOP/s of the winner on the tuner's problem (matmul; null when cached). */
  gflops: number | null;
  /** Candidates timed (0 when cached). */
  candidates: number;
  /** True when the winner came from the per-adapter cache. */
  cached: boolean;
}

/** The whole start-up tuning: its wall time and every pick. */
export interface TuningReport {
  /** Wall seconds the tuners took (cache reads included). */
  seconds: number;
  /** One pick per matmul class. */
  matmul: TunedPick[];
  /** One pick per attention storage dtype. */
  attention: TunedPick[];
  /** Whether `--retune` asked for measurements instead of cached picks (per-shape tuning follows it). */
  retune: boolean;
  /** Wall seconds per-shape tuning took (cache reads included; `gpt` adds to it). */
  shapeSeconds: number;
}

/**
 * Makes `gpu` (started with lazy tuning) a benchmark's device: every kernel
 * shape it runs untuned is still noted, but none is tuned at a wait — only
 * where the benchmark says, in each entry's warm-up (`warmUp` in
 * bench/harness.ts), before it times — so nothing tunes while it times.
 */
export function holdTuningForBench(gpu: Gpu): void {
  const lazy = lazyTuning.of(gpu);
  lazy.budget.perWaitSeconds = 0;
  lazy.onProgress = announce;
}

/** Progress of a tuning run on stderr (stdout carries only JSON lines). */
function announce({ task, done, total }: TuningProgress): void {
  if (done === 0) console.error(`bench: measuring ${task} (${total} problems)`);
}

function matmulPick(t: ClassTuning): TunedPick {
  const best = t.measurements.find((m) => m.tiling === t.best);
  return {
    key: matmulClassKey(t.class),
    pick: tilingName(t.best),
    ms: best ? best.seconds * 1000 : null,
    gflops: best ? best.gflops : null,
    candidates: t.measurements.length,
    cached: t.cached,
  };
}

function attentionPick(t: AttentionTuning): TunedPick {
  const best = t.measurements.find((m) => m.plan === t.best);
  return {
    key: t.dtype,
    pick: planName(t.best),
    ms: best ? best.ms : null,
    gflops: null,
    candidates: t.measurements.length,
    cached: t.cached,
  };
}

/**
 * Tunes `gpu` as `initGpu` does (matmul classes, then attention plans; from
 * the cache unless `retune`) and reports every pick. Frees the tuners'
 * scratch buffers so they do not show in the figures.
 */
export async function tuneForBench(gpu: Gpu, retune: boolean): Promise<TuningReport> {
  const start = performance.now();
  const matmul = await tuneMatmul(gpu, { force: retune, onProgress: announce });
  const attention = await tuneAttention(gpu, { force: retune, onProgress: announce });
  gpu.pool.releaseCached();
  gpu.resetPeakMemory();
  return { ...tuningReport(matmul, attention, (performance.now() - start) / 1000), retune };
}

/** An attention plan as logs name it: its register tile, or rows and stage. */
function planName(plan: AttentionPlan): string {
  const t = plan.tile;
  return t
    ? `tile ${t.br}x${t.bc} per thread ${t.rm}x${t.rn}`
    : `rows ${plan.rows} stage ${plan.stage}`;
}

/**
 * Tunes every matmul and attention shape run so far at its own shape (GPUs only;
 * from the cache unless the report says `retune`), between steps, and adds
 * the time to the report. Frees the scratch buffers as {@link tuneForBench}.
 */
export async function tuneShapesForBench(gpu: Gpu, report: TuningReport): Promise<void> {
  const start = performance.now();
  await tuneMatmulShapes(gpu, { force: report.retune, onProgress: announce });
  await tuneAttentionShapes(gpu, { force: report.retune, onProgress: announce });
  gpu.pool.releaseCached();
  gpu.resetPeakMemory();
  report.shapeSeconds += (performance.now() - start) / 1000;
}

/** Every per-shape pick `gpu` holds, matmul then attention, as report lines (none on CPU adapters). */
export function shapePicks(gpu: Gpu): TunedPick[] {
  const matmuls = matmulShapeReport(gpu).map((t: ShapeTuning) => ({
    key: t.key,
    pick: `${tilingName(t.pick.tiling)}${t.pick.slices > 1 ? ` split ${t.pick.slices}` : ""}`,
    ms: t.seconds * 1000,
    gflops: t.gflops,
    candidates: t.trials,
    cached: t.cached,
  }));
  const attention = attentionShapeReport(gpu).map((t: AttentionShapeTuning) => ({
    key: `attention ${t.key}`,
    pick: planName(t.plan),
    ms: t.seconds * 1000,
    gflops: null,
    candidates: t.trials,
    cached: t.cached,
  }));
  return [...matmuls, ...attention];
}

/** The report of the tuners' results: each winner with its own measurement. */
export function tuningReport(
  matmul: readonly ClassTuning[],
  attention: readonly AttentionTuning[],
  seconds: number,
): TuningReport {
  return {
    seconds,
    matmul: matmul.map(matmulPick),
    attention: attention.map(attentionPick),
    retune: false,
    shapeSeconds: 0,
  };
}

/** One pick as a line for stderr. */
function pickLine(kind: string, p: TunedPick): string {
  const figures = p.ms === null
    ? ""
    : `${p.ms.toFixed(3)} ms${p.gflops === null ? "" : ` ${p.gflops.toPrecision(3)} GFLOP/s`} `;
  const how = p.cached ? "cached" : `(best of ${p.candidates})`;
  return `tuning   ${kind.padEnd(9)} ${p.key.padEnd(16)} ${p.pick.padEnd(32)} ${figures}${how}`;
}

/** The report as lines for stderr: one per pick. */
export function tuningTable(report: TuningReport): string {
  return [
    `tuning   ${report.seconds.toFixed(1)} s`,
    ...report.matmul.map((p) => pickLine("matmul", p)),
    ...report.attention.map((p) => pickLine("attention", p)),
  ].join("\n");
}

/** Per-shape picks as lines for stderr: shape → pick → time. */
export function shapeTable(picks: readonly TunedPick[], seconds: number): string {
  return [
    `tuning   shapes ${seconds.toFixed(1)} s`,
    ...picks.map((p) => pickLine("shape", p)),
  ].join("\n");
}
