/**
 * The benchmark's start-up tuning and its report: what each matmul class and
 * each attention dtype picked, and how fast the pick ran on the tuner's
 * problem. `initGpu` tunes the same way but keeps only the winners, so the
 * benchmark starts the device untuned and runs the tuners itself to keep
 * their measurements (a winner read from the per-adapter cache has none:
 * `--retune` measures again).
 */
import {
  type AttentionTuning,
  type ClassTuning,
  type Gpu,
  matmulClassKey,
  tilingName,
  tuneAttention,
  tuneMatmul,
  type TuningProgress,
} from "../gpu/mod.ts";

/** One tuned choice: what was picked for which key, and its time where it was measured. */
export interface TunedPick {
  /** Matmul class key (`"f32/nt/large"`) or attention storage dtype. */
  key: string;
  /** The winner, as logs name it. */
  pick: string;
  /** Milliseconds per run of the winner on the tuner's problem (null when cached). */
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
    pick: `rows ${t.best.rows} stage ${t.best.stage}`,
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
  return tuningReport(matmul, attention, (performance.now() - start) / 1000);
}

/** The report of the tuners' results: each winner with its own measurement. */
export function tuningReport(
  matmul: readonly ClassTuning[],
  attention: readonly AttentionTuning[],
  seconds: number,
): TuningReport {
  return { seconds, matmul: matmul.map(matmulPick), attention: attention.map(attentionPick) };
}

/** The report as lines for stderr: one per pick. */
export function tuningTable(report: TuningReport): string {
  const line = (kind: string, p: TunedPick) => {
    const time = p.ms === null
      ? "cached"
      : `${p.ms.toFixed(3)} ms${p.gflops === null ? "" : ` ${p.gflops.toPrecision(3)} GFLOP/s`} ` +
        `(best of ${p.candidates})`;
    return `tuning   ${kind.padEnd(9)} ${p.key.padEnd(16)} ${p.pick.padEnd(32)} ${time}`;
  };
  return [
    `tuning   ${report.seconds.toFixed(1)} s`,
    ...report.matmul.map((p) => line("matmul", p)),
    ...report.attention.map((p) => line("attention", p)),
  ].join("\n");
}
