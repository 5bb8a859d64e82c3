/**
 * The examples' `--inspect`: the heat map's pure parts (bucketing logging
 * intervals into columns, per-cell shares, the log colour scale, one SVG cell
 * per row × column) and the end-of-run report (reports summed across
 * intervals, the worst rows first), on reports built by hand.
 */
import assert from "node:assert/strict";
import type { NumericsReport, NumericsRow } from "../../mod.ts";
import {
  bucketIntervals,
  FLOOR,
  heatColour,
  heatLevel,
  heatmapGrid,
  heatmapSvg,
  type InspectInterval,
  NOT_RUN,
  rowLabel,
  ZERO,
} from "../../examples/plots/heatmap.ts";
import { inspectTable, mergeReports, worstRows } from "../../examples/cli/inspect.ts";

/** A row with `values` values and the given counts (the rest zero). */
function row(
  name: string,
  phase: "forward" | "backward",
  counts: Partial<NumericsRow>,
): NumericsRow {
  return {
    name,
    op: "linear",
    phase,
    dtype: "f16",
    calls: 1,
    values: 100,
    nonFinite: 0,
    overflowF16: 0,
    underflowF16: 0,
    zeros: 0,
    amax: 1,
    ...counts,
  };
}

function report(rows: NumericsRow[], extra: Partial<NumericsReport> = {}): NumericsReport {
  return { steps: 2, rows, firstNonFinite: null, ops: [], params: [], lossScale: 1024, ...extra };
}

Deno.test("heatmap: bucketIntervals keeps order, covers every interval, sizes within one", () => {
  for (let n = 1; n <= 30; n++) {
    for (const max of [1, 3, 7, 40]) {
      const items = Array.from({ length: n }, (_, i) => i);
      const buckets = bucketIntervals(items, max);
      assert.equal(buckets.length, Math.min(n, max), `${n} into ${max}`);
      assert.deepEqual(buckets.flat(), items, "in order, each once");
      const sizes = buckets.map((b) => b.length);
      assert.ok(Math.max(...sizes) - Math.min(...sizes) <= 1, `${sizes}`);
      assert.deepEqual(sizes, [...sizes].sort((a, b) => b - a), "earlier buckets larger");
    }
  }
  assert.deepEqual(bucketIntervals([], 5), []);
});

Deno.test("heatmap: cells hold each row's share per bucket, summed over ops and calls", () => {
  const intervals: InspectInterval[] = [
    // Steps 1-2: "0" runs two ops (shares add over their values); "cast:3" and "cast:7" are one row.
    {
      from: 0,
      to: 2,
      report: report([
        row("0", "forward", { overflowF16: 3, underflowF16: 10 }),
        { ...row("0", "forward", { underflowF16: 30 }), op: "cast" },
        { ...row("cast:3", "forward", { underflowF16: 1 }), op: "cast" },
        { ...row("cast:7", "forward", { underflowF16: 3 }), op: "cast" },
        { ...row("loss_scale:0", "forward", { overflowF16: 100 }), op: "loss_scale" },
      ]),
    },
    // Steps 3-4: a backward row appears, with a NaN.
    {
      from: 2,
      to: 4,
      report: report([
        row("0", "forward", { overflowF16: 1 }),
        row("0", "backward", { nonFinite: 2, underflowF16: 50 }),
      ]),
    },
    { from: 4, to: 6, report: report([row("0", "forward", {})]) },
  ];
  const grid = heatmapGrid(intervals, 2); // [1-4], [5-6]
  assert.deepEqual(grid.rows, ["0 fwd", "cast fwd", "0 bwd"], "the scaled loss is left out");
  assert.deepEqual(grid.columns, [{ from: 0, to: 4 }, { from: 4, to: 6 }]);
  assert.deepEqual(grid.overflow, [[4 / 300, 0], [0, null], [0, null]]);
  assert.deepEqual(grid.underflow, [[40 / 300, 0], [4 / 200, null], [50 / 100, null]]);
  assert.deepEqual(grid.nonFinite, [[false, false], [false, false], [true, false]]);
  assert.equal(rowLabel({ name: "blocks.0.fc1", phase: "backward" }), "blocks.0.fc1 bwd");
});

Deno.test("heatmap: the colour scale is grey when not run, white at 0, log10 from FLOOR to 1", () => {
  assert.equal(heatColour(null, "overflow"), NOT_RUN);
  assert.equal(heatColour(0, "underflow"), ZERO);
  assert.equal(heatLevel(FLOOR), 0);
  assert.equal(heatLevel(FLOOR / 100), 0, "below the floor: the lightest");
  assert.equal(heatLevel(1), 1);
  assert.ok(Math.abs(heatLevel(1e-3) - 0.5) < 1e-12, "10^-3 halfway between 10^-6 and 1");
  assert.equal(heatColour(1, "overflow"), "#7f1d1d");
  assert.equal(heatColour(FLOOR, "underflow"), "#dbeafe");
  // Darker (smaller channel sum) as the share grows, for both ramps.
  const brightness = (c: string) =>
    [1, 3, 5].reduce((sum, i) => sum + parseInt(c.slice(i, i + 2), 16), 0);
  for (const kind of ["overflow", "underflow"] as const) {
    const levels = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1].map((f) =>
      brightness(heatColour(f, kind))
    );
    for (let i = 1; i < levels.length; i++) {
      assert.ok(levels[i] < levels[i - 1], `${kind} ${levels}`);
    }
  }
});

Deno.test("heatmap: the SVG has one cell per row × column in each panel, a dot per NaN cell in both", () => {
  const intervals: InspectInterval[] = Array.from({ length: 5 }, (_, i) => ({
    from: i * 10,
    to: (i + 1) * 10,
    report: report([
      row("0", "forward", { overflowF16: i }),
      row("2", "forward", {}),
      row("2", "backward", { nonFinite: i === 3 ? 1 : 0 }),
    ]),
  }));
  const svg = heatmapSvg(heatmapGrid(intervals, 4), "a <title> & more");
  assert.equal(svg.match(/class="cell overflow"/g)?.length, 3 * 4);
  assert.equal(svg.match(/class="cell underflow"/g)?.length, 3 * 4);
  assert.equal(svg.match(/class="nonfinite"/g)?.length, 2, "in both panels");
  assert.ok(svg.includes("a &#60;title&#62; &#38; more"), "the title is escaped");
  // Well-formed XML (Chromium refuses to draw the rest otherwise): no bare "<" or "&" in text.
  assert.ok(!/<(?![a-z/])/.test(svg), "every < opens a tag");
  assert.ok(!/&(?!#\d+;)/.test(svg), "every & is an escape");
  assert.match(heatmapSvg(heatmapGrid([], 4), "empty"), /no steps inspected/);
});

Deno.test("inspect: reports merge across intervals; the table puts NaN, overflow, underflow first", () => {
  const first = {
    step: 3,
    name: "2",
    op: "linear" as const,
    phase: "backward" as const,
    call: 0,
    scale: 8,
  };
  // One call's statistics of the f16 weight "0.weight" (10 values).
  const weightStats = (underflowF16: number, amax: number) => ({
    name: "0.weight",
    dtype: "f16" as const,
    calls: 1,
    values: 10,
    nonFinite: 0,
    overflowF16: 0,
    underflowF16,
    zeros: 0,
    amax,
    underflowFraction: underflowF16 / 10,
  });
  const a = report([row("0", "forward", { underflowF16: 5, amax: 7 })], {
    params: [weightStats(1, 1)],
    ops: [{ op: "linear", calls: { f16: 2 } }],
  });
  const b = report(
    [row("0", "forward", { underflowF16: 1, amax: 3 }), row("2", "backward", { nonFinite: 1 })],
    {
      firstNonFinite: first,
      params: [weightStats(3, 2)],
      ops: [{ op: "linear", calls: { f16: 1, f32: 1 } }],
      lossScale: 4,
    },
  );
  const total = mergeReports([a, b, report([])]);
  assert.equal(total.steps, 6);
  assert.deepEqual(
    total.rows[0],
    row("0", "forward", { calls: 2, values: 200, underflowF16: 6, amax: 7 }),
  );
  assert.deepEqual(total.firstNonFinite, first);
  assert.equal(total.params[0].underflowF16, 4);
  assert.equal(total.params[0].underflowFraction, 4 / 20);
  assert.deepEqual(total.ops, [{ op: "linear", calls: { f16: 3, f32: 1 } }]);
  assert.equal(total.lossScale, 1024, "the last report's scale");
  assert.equal(a.rows[0].underflowF16, 5, "the reports themselves are not changed");

  const rows = [
    row("under", "forward", { underflowF16: 50 }),
    { ...row("scaled loss", "forward", { overflowF16: 100 }), op: "loss_scale" as const },
    row("over", "forward", { overflowF16: 1 }),
    row("nan", "backward", { nonFinite: 1 }),
    row("fine", "forward", {}),
  ];
  assert.deepEqual(worstRows(rows).map((r) => r.name), [
    "nan",
    "over",
    "under",
    "scaled loss",
    "fine",
  ]);
  const text = inspectTable(report(rows, { firstNonFinite: first }), 3);
  const lines = text.split("\n");
  assert.match(
    lines[0],
    /over 2 steps: first NaN\/Inf at step 3 in 2 \(linear, backward, loss scale 8\)/,
  );
  assert.match(lines[1], /^layer\s+op\s+phase\s+dtype\s+NaN\/Inf\s+overflow\s+underflow/);
  assert.deepEqual(lines.slice(2, 5).map((l) => l.split(/\s+/)[0]), ["nan", "over", "under"]);
  assert.match(lines[4], /\s50%\s/, "underflow as a share of the values");
  assert.match(lines[5], /3 of 5 rows/);
});
