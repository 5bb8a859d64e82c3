/**
 * The examples' `--inspect`: a `NumericsInspector` attached to the trainer,
 * its report read (and reset) only where the script already reads for
 * logging, the reports summed on the CPU into one for the end: a short table
 * (the rows with the most NaN/Inf, overflow and underflow first), an
 * `inspect` JSON event with --json, and with --plot a heat map over steps.
 *
 * @module
 */
import {
  type Module,
  NumericsInspector,
  type NumericsReport,
  type NumericsRow,
  type ParameterGradientRow,
} from "../../mod.ts";
import { BEYOND_F16_BY_DESIGN, type InspectInterval, writeHeatmap } from "../plots/heatmap.ts";

/** Rows the table prints. */
export const TABLE_ROWS = 10;

/** An inspector and the reports it gave at each logging point. */
export class InspectLog {
  readonly inspector: NumericsInspector;
  readonly intervals: InspectInterval[] = [];
  /** The script's step before the inspector's first (its steps count from 0). */
  #start: number;
  #last: number;

  /** An inspector for `model`; the first interval starts after step `firstStep`. */
  constructor(model: Module, firstStep = 0) {
    this.inspector = new NumericsInspector(model);
    this.#start = this.#last = firstStep;
  }

  /** The first interval starts after `step` (where a resumed run goes on). */
  startAfter(step: number): void {
    this.#start = this.#last = step;
  }

  /** At a logging point after `step`: reads the counts since the last one (a sync) and resets. */
  async interval(step: number): Promise<void> {
    const report = await this.inspector.report({ reset: true });
    if (report.steps > 0) this.intervals.push({ from: this.#last, to: step, report });
    this.#last = step;
  }

  /** The whole run's report: every interval's summed; its first NaN/Inf's step as the script counts. */
  total(): NumericsReport {
    const total = mergeReports(this.intervals.map((i) => i.report));
    const first = total.firstNonFinite;
    if (first) total.firstNonFinite = { ...first, step: this.#start + first.step + 1 };
    return total;
  }

  /** Frees the inspector's GPU buffer. */
  dispose(): void {
    this.inspector.dispose();
  }
}

/** Adds counts; the largest amax; the first firstNonFinite; the last loss scale. */
export function mergeReports(reports: readonly NumericsReport[]): NumericsReport {
  const rows = new Map<string, NumericsRow>();
  const params = new Map<string, ParameterGradientRow>();
  const ops = new Map<string, NumericsReport["ops"][number]>();
  const add = <T extends NumericsRow | ParameterGradientRow>(into: T, r: T) => {
    into.calls += r.calls;
    into.values += r.values;
    into.nonFinite += r.nonFinite;
    into.overflowF16 += r.overflowF16;
    into.underflowF16 += r.underflowF16;
    into.zeros += r.zeros;
    into.amax = Math.max(into.amax, r.amax);
  };
  for (const report of reports) {
    for (const r of report.rows) {
      const key = `${r.name}\u0000${r.op}\u0000${r.phase}\u0000${r.dtype}`;
      const into = rows.get(key);
      if (into) add(into, r);
      else rows.set(key, { ...r });
    }
    for (const p of report.params) {
      const key = `${p.name}\u0000${p.dtype}`;
      const into = params.get(key);
      if (into) add(into, p);
      else params.set(key, { ...p });
    }
    for (const o of report.ops) {
      const into = ops.get(o.op) ?? { op: o.op, calls: {} };
      for (const [dtype, n] of Object.entries(o.calls) as [keyof typeof o.calls, number][]) {
        into.calls[dtype] = (into.calls[dtype] ?? 0) + n;
      }
      ops.set(o.op, into);
    }
  }
  for (const p of params.values()) {
    p.underflowFraction = p.values > 0 ? p.underflowF16 / p.values : 0;
  }
  return {
    steps: reports.reduce((n, r) => n + r.steps, 0),
    rows: [...rows.values()],
    firstNonFinite: reports.find((r) => r.firstNonFinite)?.firstNonFinite ?? null,
    ops: [...ops.values()],
    params: [...params.values()],
    lossScale: reports.at(-1)?.lossScale ?? null,
  };
}

/** The share of a row's values that underflow f16. */
const underflowShare = (r: NumericsRow) => (r.values > 0 ? r.underflowF16 / r.values : 0);

/** Overflow that counts: none for ops beyond f16's range by design (the scaled loss). */
const overflow = (r: NumericsRow) => (BEYOND_F16_BY_DESIGN.has(r.op) ? 0 : r.overflowF16);

/** Rows by how badly f16 holds them: most NaN/Inf, then overflow, then underflow share. */
export function worstRows(rows: readonly NumericsRow[]): NumericsRow[] {
  return [...rows].sort((a, b) =>
    b.nonFinite - a.nonFinite || overflow(b) - overflow(a) ||
    underflowShare(b) - underflowShare(a)
  );
}

const percent = (part: number, whole: number) =>
  part === 0 ? "0" : `${((part / Math.max(1, whole)) * 100).toPrecision(2)}%`;

/** The text summary: first non-finite, the worst rows as a table, gradient underflow. */
export function inspectTable(report: NumericsReport, rows = TABLE_ROWS): string {
  const first = report.firstNonFinite;
  const head = `numerics (--inspect) over ${report.steps} steps: first NaN/Inf ` +
    (first
      ? `at step ${first.step} in ${first.name} (${first.op}, ${first.phase}` +
        `${first.scale === null ? "" : `, loss scale ${first.scale}`})`
      : "none");
  const cells = [[
    "layer",
    "op",
    "phase",
    "dtype",
    "NaN/Inf",
    "overflow",
    "underflow",
    "zeros",
    "amax",
  ]];
  for (const r of worstRows(report.rows).slice(0, rows)) {
    cells.push([
      r.name.length > 24 ? `${r.name.slice(0, 23)}…` : r.name,
      r.op,
      r.phase,
      r.dtype,
      String(r.nonFinite),
      BEYOND_F16_BY_DESIGN.has(r.op) ? "-" : String(r.overflowF16),
      percent(r.underflowF16, r.values),
      percent(r.zeros, r.values),
      r.amax.toPrecision(3),
    ]);
  }
  const widths = cells[0].map((_, c) => Math.max(...cells.map((row) => row[c].length)));
  const lines = cells.map((row) => row.map((s, c) => s.padEnd(widths[c])).join("  ").trimEnd());
  const params = [...report.params].sort((a, b) => b.underflowFraction - a.underflowFraction);
  const advice = params.slice(0, 3).filter((p) => p.underflowF16 > 0)
    .map((p) => `${p.name} ${percent(p.underflowF16, p.values)}`);
  return [
    head,
    ...lines,
    `(${Math.min(rows, report.rows.length)} of ${report.rows.length} rows; ` +
    "underflow and zeros are shares of the values)",
    `gradients underflowing f16${
      report.lossScale === null ? "" : ` at loss scale ${report.lossScale}`
    }: ${advice.length ? advice.join(", ") : "none"}`,
  ].join("\n");
}

/** Where `--plot PATH`'s heat map goes: PATH with `.numerics.svg` for its `.svg`. */
export function heatmapPath(plot: string): string {
  return `${plot.replace(/\.svg$/i, "")}.numerics.svg`;
}

/**
 * At the end of a run: writes the heat map (with a --plot path), then prints
 * the table, or with --json the `inspect` event (the whole report).
 */
export async function finishInspect(
  log: InspectLog,
  out: {
    emit: (event: string, fields: Record<string, unknown>, text: string) => void;
    plot: string | undefined;
    title: string;
  },
): Promise<void> {
  const heatmap = out.plot ? heatmapPath(out.plot) : null;
  if (heatmap) await writeHeatmap(heatmap, log.intervals, out.title);
  const report = log.total();
  out.emit(
    "inspect",
    { ...report, heatmap },
    inspectTable(report) + (heatmap ? `\nwrote ${heatmap}` : ""),
  );
}
