/**
 * The examples' `--inspect --plot` heat map: for every layer and phase (rows)
 * and every stretch of steps (columns), the share of values that overflow
 * f16 (left, red) and that underflow it (right, blue), from the numerics
 * inspector's reports taken at each logging point. The pure parts
 * ({@link bucketIntervals}, {@link heatmapGrid}, {@link heatColour}) are
 * apart from the drawing ({@link heatmapSvg}).
 *
 * @module
 */
import type { NumericsReport, NumericsRow } from "../../mod.ts";
import { escape, px, writeSvg } from "./loss_chart.ts";
import { linearScale, niceTicks, tickLabels } from "./axes.ts";

/** One inspector report covering steps (from, to]. */
export interface InspectInterval {
  from: number;
  to: number;
  report: NumericsReport;
}

/** What the heat map shows: fractions per row label and column. */
export interface HeatmapGrid {
  /** "layer fwd" / "layer bwd", in order of first appearance. */
  rows: string[];
  /** The steps (from, to] each column covers. */
  columns: { from: number; to: number }[];
  /** [row][column]: overflowing values / values counted; null where the row did not run. */
  overflow: (number | null)[][];
  /** [row][column]: underflowing values / values counted; null where the row did not run. */
  underflow: (number | null)[][];
  /** [row][column]: whether any NaN/Inf was counted there. */
  nonFinite: boolean[][];
}

/**
 * Ops whose f32 outputs lie beyond f16's range by design: the scaled loss and
 * its seed gradient (loss × scale). They never become f16, so their
 * "overflow" is no finding: the heat map leaves them out, the table ranks
 * them by NaN/Inf only.
 */
export const BEYOND_F16_BY_DESIGN: ReadonlySet<string> = new Set(["loss_scale"]);

/** The most columns drawn; longer runs merge neighbouring intervals. */
export const MAX_COLUMNS = 40;
/** Fractions at or below this get the lightest colour (the scale is log10 from here to 1). */
export const FLOOR = 1e-6;

/**
 * `intervals` in at most `maxColumns` groups of consecutive intervals, the
 * groups' sizes differing by at most one (the earlier groups larger).
 */
export function bucketIntervals<T>(intervals: readonly T[], maxColumns = MAX_COLUMNS): T[][] {
  const columns = Math.min(intervals.length, Math.max(1, maxColumns));
  const base = Math.floor(intervals.length / columns), extra = intervals.length % columns;
  const buckets: T[][] = [];
  let at = 0;
  for (let c = 0; c < columns && at < intervals.length; c++) {
    const size = base + (c < extra ? 1 : 0);
    buckets.push(intervals.slice(at, at + size));
    at += size;
  }
  return buckets;
}

/**
 * A heat-map row's label: the module path and the phase ("fwd", "bwd"); ops
 * outside submodules ("cast:12") are one row per op ("cast").
 */
export function rowLabel(row: Pick<NumericsRow, "name" | "phase">): string {
  return `${row.name.replace(/:\d+$/, "")} ${row.phase === "forward" ? "fwd" : "bwd"}`;
}

/** The grid of `intervals` (in step order), bucketed into at most `maxColumns` columns. */
export function heatmapGrid(
  intervals: readonly InspectInterval[],
  maxColumns = MAX_COLUMNS,
): HeatmapGrid {
  const buckets = bucketIntervals(intervals, maxColumns);
  const rows: string[] = [];
  const index = new Map<string, number>();
  for (const interval of intervals) {
    for (const r of interval.report.rows) {
      if (BEYOND_F16_BY_DESIGN.has(r.op)) continue;
      const label = rowLabel(r);
      if (!index.has(label)) index.set(label, rows.push(label) - 1);
    }
  }
  const empty = <T>(fill: T) => rows.map(() => buckets.map(() => fill));
  const sums = empty(null as null | { values: number; over: number; under: number; bad: number });
  buckets.forEach((bucket, c) => {
    for (const r of bucket.flatMap((i) => i.report.rows)) {
      const i = index.get(rowLabel(r));
      if (i === undefined) continue; // beyond f16 by design
      const s = sums[i][c] ??= { values: 0, over: 0, under: 0, bad: 0 };
      s.values += r.values;
      s.over += r.overflowF16;
      s.under += r.underflowF16;
      s.bad += r.nonFinite;
    }
  });
  const share = (pick: "over" | "under") =>
    sums.map((row) => row.map((s) => (s && s.values > 0 ? s[pick] / s.values : null)));
  return {
    rows,
    columns: buckets.map((b) => ({ from: b[0].from, to: b.at(-1)!.to })),
    overflow: share("over"),
    underflow: share("under"),
    nonFinite: sums.map((row) => row.map((s) => (s?.bad ?? 0) > 0)),
  };
}

/** The two colour ramps, lightest to darkest (RGB). */
const RAMPS = {
  overflow: [[254, 226, 226], [127, 29, 29]],
  underflow: [[219, 234, 254], [30, 58, 138]],
} as const;
/** Colours of a cell with nothing counted, and of a zero fraction. */
export const NOT_RUN = "#e5e7eb", ZERO = "#ffffff";

/**
 * Where `fraction` lies on the colour scale, 0 to 1: log10 from {@link FLOOR}
 * (and below) to 1, so one value in a million and all of them differ.
 */
export function heatLevel(fraction: number): number {
  const t = (Math.log10(Math.max(fraction, FLOOR)) - Math.log10(FLOOR)) / -Math.log10(FLOOR);
  return Math.min(1, Math.max(0, t));
}

/** The fill of a cell: grey if not run, white at 0, else the ramp at {@link heatLevel}. */
export function heatColour(fraction: number | null, kind: keyof typeof RAMPS): string {
  if (fraction === null) return NOT_RUN;
  if (fraction === 0) return ZERO;
  const [from, to] = RAMPS[kind], t = heatLevel(fraction);
  const hex = (i: number) => Math.round(from[i] + (to[i] - from[i]) * t).toString(16);
  return `#${[0, 1, 2].map((i) => hex(i).padStart(2, "0")).join("")}`;
}

const LABELS = 200, GAP = 36, PANEL = 320, TOP = 78, BOTTOM = 104, ROW_H = 16;
const W = LABELS + 2 * PANEL + GAP + 20;
const PANELS = [
  { kind: "overflow", title: "overflow in f16 (|x| > 65504)", left: LABELS },
  { kind: "underflow", title: "underflow in f16 (0 < |x| < 2⁻¹⁴)", left: LABELS + PANEL + GAP },
] as const;

/** One panel: a `<rect class="cell KIND">` per row × column, a dot where NaN/Inf appeared. */
function panel(grid: HeatmapGrid, p: (typeof PANELS)[number]): string {
  const first = grid.columns[0].from, last = grid.columns.at(-1)!.to;
  const ticks = niceTicks(first, last, 4).filter((t) => t >= first && t <= last);
  const x = linearScale(first, last, p.left, p.left + PANEL);
  const bottom = TOP + grid.rows.length * ROW_H;
  const parts = [
    `<text x="${p.left + PANEL / 2}" y="${TOP - 10}" text-anchor="middle">${
      escape(p.title)
    }</text>`,
  ];
  grid.rows.forEach((_, r) => {
    grid.columns.forEach((c, k) => {
      const fraction = grid[p.kind][r][k];
      const title = `${grid.rows[r]}, steps ${c.from + 1}–${c.to}: ` +
        (fraction === null ? "not run" : `${(fraction * 100).toPrecision(3)}%`);
      parts.push(
        `<rect class="cell ${p.kind}" x="${px(x(c.from))}" y="${TOP + r * ROW_H}" ` +
          `width="${px(x(c.to) - x(c.from))}" height="${ROW_H}" ` +
          `fill="${heatColour(fraction, p.kind)}"><title>${escape(title)}</title></rect>`,
      );
      if (grid.nonFinite[r][k]) {
        parts.push(
          `<circle class="nonfinite" cx="${px((x(c.from) + x(c.to)) / 2)}" ` +
            `cy="${TOP + (r + 0.5) * ROW_H}" r="3" fill="black"/>`,
        );
      }
    });
  });
  const labels = tickLabels(ticks);
  parts.push(
    `<rect x="${p.left}" y="${TOP}" width="${PANEL}" height="${bottom - TOP}" ` +
      `fill="none" stroke="#9ca3af"/>`,
    ...ticks.map((t, i) =>
      `<text x="${px(x(t))}" y="${bottom + 16}" text-anchor="middle">${labels[i]}</text>`
    ),
    `<text x="${p.left + PANEL / 2}" y="${bottom + 34}" text-anchor="middle">step</text>`,
  );
  return parts.join("\n");
}

/** The colour key: both ramps from {@link FLOOR} to 1, and the grey, white and dot meanings. */
function legend(y: number): string {
  const stops = [FLOOR, 1e-4, 1e-2, 1];
  const parts: string[] = [];
  PANELS.forEach((p) => {
    const x = linearScale(0, 1, p.left, p.left + 200);
    for (let i = 0; i < 40; i++) {
      const f = 10 ** (Math.log10(FLOOR) * (1 - (i + 0.5) / 40));
      parts.push(
        `<rect x="${px(x(i / 40))}" y="${y}" width="${px(200 / 40 + 0.5)}" height="10" ` +
          `fill="${heatColour(f, p.kind)}"/>`,
      );
    }
    for (const s of stops) {
      const label = s === 1 ? "100%" : `10<tspan dy="-5" font-size="8">${Math.log10(s)}</tspan>`;
      parts.push(
        `<text x="${px(x(heatLevel(s)))}" y="${y + 24}" text-anchor="middle">${label}</text>`,
      );
    }
  });
  parts.push(
    `<rect x="${LABELS}" y="${y + 34}" width="10" height="10" fill="${NOT_RUN}"/>` +
      `<text x="${LABELS + 14}" y="${y + 43}">not run</text>`,
    `<rect x="${LABELS + 80}" y="${
      y + 34
    }" width="10" height="10" fill="${ZERO}" stroke="#9ca3af"/>` +
      `<text x="${LABELS + 94}" y="${y + 43}">none</text>`,
    `<circle cx="${LABELS + 155}" cy="${y + 39}" r="3" fill="black"/>` +
      `<text x="${LABELS + 162}" y="${y + 43}">NaN/Inf seen</text>`,
  );
  return parts.join("\n");
}

/**
 * The heat map as SVG text: row labels at the left, then the overflow and
 * the underflow panel (shares of the values counted in each cell).
 */
export function heatmapSvg(grid: HeatmapGrid, title: string): string {
  const bottom = TOP + Math.max(1, grid.rows.length) * ROW_H;
  const H = bottom + BOTTOM;
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11" fill="#374151">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${W / 2}" y="22" text-anchor="middle" font-size="14">${escape(title)}</text>`,
    `<text x="${W / 2}" y="42" text-anchor="middle" fill="#6b7280">` +
    "share of each layer's values per stretch of steps (log colour scale)</text>",
  ];
  if (grid.columns.length === 0) {
    parts.push(`<text x="${W / 2}" y="${TOP + 12}" text-anchor="middle">no steps inspected</text>`);
  } else {
    grid.rows.forEach((label, r) =>
      parts.push(
        `<text class="row" x="${LABELS - 8}" y="${TOP + (r + 0.5) * ROW_H + 4}" text-anchor="end">${
          escape(label.length > 30 ? `${label.slice(0, 29)}…` : label)
        }</text>`,
      )
    );
    parts.push(...PANELS.map((p) => panel(grid, p)), legend(bottom + 48));
  }
  parts.push("</svg>");
  return parts.join("\n") + "\n";
}

/** Writes the heat map of `intervals` to `path` atomically. */
export function writeHeatmap(
  path: string,
  intervals: readonly InspectInterval[],
  title: string,
): Promise<void> {
  return writeSvg(path, heatmapSvg(heatmapGrid(intervals), title));
}
