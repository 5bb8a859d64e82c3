/**
 * What `gpu.profile(fn)` returns: the profiled dispatches aggregated by kernel
 * family and config, sorted by GPU time, as `torch.profiler`'s
 * `key_averages()` reads, and the same as a printable table.
 */
import type { DispatchRecord, ProfileTiming } from "./profiler.ts";

/** One kernel (family and config) in a profile. */
export interface ProfileRow {
  /** The kernel family, e.g. `"matmul"`. */
  kernel: string;
  /** Its config, as the pipeline cache key spells it (`dtype=f16,...`). */
  config: string;
  /** Dispatches. */
  calls: number;
  /** GPU milliseconds, all calls. */
  totalMs: number;
  /** GPU milliseconds per call. */
  meanMs: number;
  /** Fraction of the profile's GPU time. */
  share: number;
  /** Bytes moved by all calls (null when unknown). */
  bytes: number | null;
  /** FLOPs of all calls (null when unknown). */
  flops: number | null;
  /** Achieved bandwidth, GB/s (null when unknown). */
  gbPerSec: number | null;
  /** Achieved arithmetic rate, TFLOP/s (null when unknown). */
  tflops: number | null;
}

/** A profile: totals and one row per kernel, most GPU time first. */
export interface ProfileReport {
  /** How dispatches were timed (GPU timestamps, or wall time per flush split over its dispatches). */
  timing: ProfileTiming;
  /** The adapter it ran on. */
  adapter: string;
  /** Dispatches profiled. */
  dispatches: number;
  /** Sum of the dispatches' GPU times, ms. */
  gpuMs: number;
  /** Wall time of the profiled function and its GPU work, ms. */
  wallMs: number;
  /** One row per kernel family and config, most GPU time first. */
  rows: ProfileRow[];
  /** The rows as a text table (what `gpu.profile` prints). */
  table(): string;
}

/** Aggregates `records` into a report. */
export function profileReport(
  records: readonly DispatchRecord[],
  context: { timing: ProfileTiming; adapter: string; wallMs: number },
): ProfileReport {
  const groups = new Map<string, DispatchRecord[]>();
  for (const r of records) {
    const list = groups.get(r.key);
    if (list) list.push(r);
    else groups.set(r.key, [r]);
  }
  const gpuMs = records.reduce((sum, r) => sum + r.ms, 0);
  const rows = [...groups.entries()].map(([key, list]): ProfileRow => {
    const totalMs = list.reduce((sum, r) => sum + r.ms, 0);
    const known = (pick: (r: DispatchRecord) => number | undefined) =>
      list.every((r) => pick(r) !== undefined) ? list.reduce((s, r) => s + pick(r)!, 0) : null;
    const bytes = known((r) => r.bytes), flops = known((r) => r.flops);
    const seconds = totalMs / 1000;
    return {
      kernel: list[0].family,
      config: key.slice(key.indexOf("{") + 1, -1),
      calls: list.length,
      totalMs,
      meanMs: totalMs / list.length,
      share: gpuMs > 0 ? totalMs / gpuMs : 0,
      bytes,
      flops,
      gbPerSec: bytes !== null && seconds > 0 ? bytes / seconds / 1e9 : null,
      tflops: flops !== null && flops > 0 && seconds > 0 ? flops / seconds / 1e12 : null,
    };
  }).sort((a, b) => b.totalMs - a.totalMs);
  const report: ProfileReport = {
    ...context,
    dispatches: records.length,
    gpuMs,
    rows,
    table: () => formatTable(report),
  };
  return report;
}

const fixed = (x: number | null, digits: number) => (x === null ? "" : x.toFixed(digits));

function formatTable(report: ProfileReport): string {
  const header = ["kernel", "calls", "total ms", "mean ms", "share", "GB/s", "TFLOP/s", "config"];
  const lines = report.rows.map((r) => [
    r.kernel,
    String(r.calls),
    fixed(r.totalMs, 3),
    fixed(r.meanMs, 4),
    `${(100 * r.share).toFixed(1)}%`,
    fixed(r.gbPerSec, 1),
    fixed(r.tflops, 2),
    r.config.length > 60 ? `${r.config.slice(0, 57)}...` : r.config,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i].length)));
  const pad = (cells: string[]) =>
    cells.map((c, i) => (i === 0 || i === 7 ? c.padEnd(widths[i]) : c.padStart(widths[i])))
      .join("  ").trimEnd();
  const how = report.timing === "timestamp"
    ? "GPU timestamps per dispatch"
    : "wall time per submit, split evenly over its dispatches (no timestamp-query)";
  return [
    `profile on ${report.adapter}: ${report.dispatches} dispatches, ${
      report.gpuMs.toFixed(3)
    } ms of GPU time (${how}), ${report.wallMs.toFixed(1)} ms wall`,
    pad(header),
    ...lines.map(pad),
  ].join("\n");
}
