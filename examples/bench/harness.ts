/** What the benchmark entries share: the result record, options, timing and clean-up. */
import type { Gpu } from "../../mod.ts";
import { tunePending } from "../../gpu/mod.ts";
import type { TuningReport } from "./tuning.ts";

/** One benchmark result line. */
export interface Result extends Record<string, unknown> {
  bench: string;
  mode: string;
  peakBytes: number;
}

/**
 * Sizes of the real-size entries: `"real"` is the size the H100 figures were
 * taken at; `"small"` runs on a CPU adapter in seconds; `"auto"` (default)
 * is real on GPUs and small on CPU adapters.
 */
export type BenchSize = "auto" | "real" | "small";

/** Options every entry gets. */
export interface BenchOptions {
  /** Timed training steps (entries scale it to their cost). */
  steps: number;
  /** Timed runs per kernel or op. */
  repeats: number;
  /** Size of the real-size entries (gpt, ops, matmul's large shapes). */
  size: BenchSize;
  /** What the start-up tuning picked (gpt reports it). */
  tuning: TuningReport;
}

/** `size` resolved for `gpu`. */
export function resolveSize(gpu: Gpu, size: BenchSize): "real" | "small" {
  if (size !== "auto") return size;
  return gpu.adapterProfile.cpu ? "small" : "real";
}

/** Frees whatever a benchmark made. */
export function disposeAll(...things: { dispose(): void }[]): void {
  for (const thing of things) thing.dispose();
}

/**
 * Runs `fn` once and tunes what it ran: the warm-up before a timing. Its
 * pipelines compile and the pool fills, and every kernel shape it noted
 * untuned is tuned now (the benchmark's device never tunes at a wait:
 * `holdTuningForBench`), so what is timed next runs tuned kernels.
 */
export async function warmUp(gpu: Gpu, fn: () => void): Promise<void> {
  fn();
  await gpu.sync();
  await tunePending(gpu);
}

/** Runs `fn` `count` times between two GPU syncs, after a {@link warmUp}, and returns seconds per run. */
export async function timed(gpu: Gpu, count: number, fn: () => void): Promise<number> {
  await warmUp(gpu, fn);
  const start = performance.now();
  for (let i = 0; i < count; i++) fn();
  await gpu.sync();
  return (performance.now() - start) / 1000 / count;
}

/**
 * GPU milliseconds per run of `fn` (`count` runs, after a {@link warmUp}), from
 * the profiler's timestamps where the adapter has them, with the bytes and
 * FLOPs the kernels reported; wall time per run where it has none.
 */
export async function gpuTimed(
  gpu: Gpu,
  count: number,
  fn: () => void,
): Promise<{ ms: number; bytes: number | null; flops: number | null; timing: string }> {
  await warmUp(gpu, fn);
  if (!gpu.device.features.has("timestamp-query")) {
    return { ms: (await timed(gpu, count, fn)) * 1000, bytes: null, flops: null, timing: "wall" };
  }
  const report = await gpu.profile(() => {
    for (let i = 0; i < count; i++) fn();
  }, { print: false });
  // Kernels that report no FLOPs (a bias reduction beside a matmul) count as none.
  const sum = (pick: (r: typeof report.rows[number]) => number | null) => {
    const known = report.rows.map(pick).filter((x): x is number => x !== null && x > 0);
    return known.length > 0 ? known.reduce((a, b) => a + b, 0) / count : null;
  };
  return {
    ms: report.gpuMs / count,
    bytes: sum((r) => r.bytes),
    flops: sum((r) => r.flops),
    timing: "timestamp",
  };
}

/**
 * The host CPU: "AMD EPYC, 2 threads" where Linux's /proc/cpuinfo can be read
 * (Deno lets only `--allow-all` read /proc), else just the thread count.
 */
export async function cpuName(): Promise<string> {
  const threads = `${navigator.hardwareConcurrency} threads`;
  try {
    const info = await Deno.readTextFile("/proc/cpuinfo");
    const model = info.match(/^model name\s*:\s*(.+)$/m)?.[1]?.trim();
    return model ? `${model}, ${threads}` : threads;
  } catch {
    return `${threads} (run with -A to name the model)`;
  }
}
