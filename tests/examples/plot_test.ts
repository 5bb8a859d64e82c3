/**
 * The examples' `--plot` charts: round ticks that enclose the data, the log
 * scale of the loss-scale axis, and that every logged point (and the
 * validation loss and baseline) is drawn where its value says.
 */
import assert from "node:assert/strict";
import { lossChartSvg, type PlotPoint } from "../../examples/plots/loss_chart.ts";
import {
  linearScale,
  log2Scale,
  log2Ticks,
  niceTicks,
  tickLabels,
} from "../../examples/plots/axes.ts";

/** Is `step` 1, 2 or 5 × 10^k? */
function isRoundStep(step: number): boolean {
  const magnitude = 10 ** Math.floor(Math.log10(step) + 1e-9);
  return [1, 2, 5, 10].some((m) => Math.abs(step / magnitude - m) < 1e-6);
}

Deno.test("plot: niceTicks are round, evenly spaced and enclose the data tightly", () => {
  assert.deepEqual(niceTicks(2.03, 3.31), [2, 2.2, 2.4, 2.6, 2.8, 3, 3.2, 3.4]);
  assert.deepEqual(niceTicks(0.05, 2.3), [0, 0.5, 1, 1.5, 2, 2.5]);
  assert.deepEqual(niceTicks(0, 128), [0, 20, 40, 60, 80, 100, 120, 140]);
  assert.deepEqual(niceTicks(0.1, 0.3), [0.1, 0.15, 0.2, 0.25, 0.3], "no 0.30000000000000004");
  let seed = 7;
  const random = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
  for (let i = 0; i < 2000; i++) {
    const lo = (random() - 0.3) * 10 ** Math.floor(random() * 8 - 3);
    const hi = lo + random() * 10 ** Math.floor(random() * 8 - 3);
    const ticks = niceTicks(lo, hi);
    const step = ticks[1] - ticks[0];
    assert.ok(ticks[0] <= lo && ticks.at(-1)! >= hi, `[${lo}, ${hi}] → ${ticks}`);
    assert.ok(ticks.length >= 2 && ticks.length <= 12, `${ticks.length} ticks for [${lo}, ${hi}]`);
    assert.ok(isRoundStep(step), `step ${step} for [${lo}, ${hi}]`);
    // Tight: the axis spans at most one step beyond the data on each side.
    assert.ok(ticks[0] > lo - step - 1e-9 * Math.abs(lo) && ticks.at(-1)! < hi + step * 1.000001);
    for (let t = 1; t < ticks.length; t++) {
      assert.ok(Math.abs(ticks[t] - ticks[t - 1] - step) <= 1e-9 * Math.max(1, Math.abs(step)));
    }
  }
  const flat = niceTicks(2, 2);
  assert.ok(flat[0] < 2 && flat.at(-1)! > 2 && new Set(flat).size === flat.length, `${flat}`);
});

Deno.test("plot: tick labels share their decimals and never repeat", () => {
  assert.deepEqual(tickLabels([2, 2.2, 2.4]), ["2.0", "2.2", "2.4"]);
  assert.deepEqual(tickLabels([0, 0.05, 0.1]), ["0", "0.05", "0.10"]);
  assert.deepEqual(tickLabels([0, 50, 100, 150]), ["0", "50", "100", "150"]);
  assert.deepEqual(tickLabels([0, 20000, 40000]), ["0", "20k", "40k"]);
  for (const [lo, hi] of [[0, 1e-4], [1.234, 1.2342], [0, 5e6], [-3, 7]]) {
    const labels = tickLabels(niceTicks(lo, hi));
    assert.equal(new Set(labels).size, labels.length, `${labels}`);
  }
});

Deno.test("plot: the loss scale's axis is log2, one distinct label per power of two", () => {
  assert.deepEqual(log2Ticks(16, 16), [15, 16, 17], "a constant scale: 2^16 once, not twice");
  assert.deepEqual(log2Ticks(13, 16), [12, 13, 14, 15, 16, 17], "off the frame on both sides");
  assert.deepEqual(log2Ticks(10, 16), [8, 10, 12, 14, 16, 18], "every 2nd power past six");
  const wide = log2Ticks(0, 24);
  assert.ok(wide.length <= 7 && wide[0] <= 0 && wide.at(-1)! >= 24, `${wide}`);
  assert.ok(wide.every((e, i) => i === 0 || e - wide[i - 1] === wide[1] - wide[0]));
  const y = log2Scale(0, 16, 300, 0);
  assert.equal(y(1), 300);
  assert.equal(y(65536), 0);
  assert.equal(y(256), 150, "2^8 is halfway between 2^0 and 2^16");
  assert.equal(y(2 ** 12) - y(2 ** 13), y(2 ** 4) - y(2 ** 5), "equal ratios, equal distances");
  assert.equal(linearScale(2, 4, 100, 0)(3), 50);
});

/** The vertices of the SVG path with this id, and how many separate lines it has. */
function pathOf(svg: string, id: string): { vertices: [number, number][]; lines: number } | null {
  const d = svg.match(new RegExp(`<path d="([^"]*)" id="${id}"`))?.[1];
  if (d === undefined) return null;
  const vertices = [...d.matchAll(/[ML](-?[\d.]+),(-?[\d.]+)/g)]
    .map((m) => [Number(m[1]), Number(m[2])] as [number, number]);
  return { vertices, lines: (d.match(/M/g) ?? []).length };
}

/** The y pixel of the left axis's grid line labelled `label`. */
function gridY(svg: string, label: string): number {
  const m = svg.match(
    new RegExp(`y1="([\\d.]+)" y2="[\\d.]+" stroke="#e5e7eb"/><text [^>]*>${label}<`),
  );
  assert.ok(m, `a grid line labelled ${label}`);
  return Number(m[1]);
}

Deno.test("plot: every logged point is drawn at its value, with validation and baseline", () => {
  // A GPT-like curve: 3.3 falling to ~2.1, logged every 10 steps for 3000 steps.
  const points: PlotPoint[] = Array.from({ length: 300 }, (_, i) => ({
    step: 10 * (i + 1),
    loss: 2.1 + 1.2 * Math.exp(-i / 40),
    lossScale: i < 100 ? 65536 : 32768,
  }));
  points[150].loss = 3; // exactly on a grid line
  points[299].loss = 2.2;
  const svg = lossChartSvg({
    title: "tiny GPT <AMP>",
    points,
    validation: [{ step: 3000, loss: 2.4 }],
    baseline: { label: "bigram baseline", loss: 2.45 },
  });
  // The first path is the loss (tests/examples/examples_cli_test.ts counts its points).
  assert.match(svg.match(/<path d="M[^"]*"[^>]*>/)![0], /id="training-loss"/);
  const loss = pathOf(svg, "training-loss")!;
  assert.equal(loss.vertices.length, 300, "one vertex per logged point");
  assert.equal(loss.lines, 1);
  assert.ok(loss.vertices.every(([x], i) => i === 0 || x > loss.vertices[i - 1][0]));
  assert.equal(loss.vertices[150][1], gridY(svg, "3.0"), "loss 3.0 sits on the 3.0 grid line");
  assert.equal(loss.vertices[299][1], gridY(svg, "2.2"));
  // The y axis fits the data (2.1…3.3), not 0…3.3: no grid line at 0 or 1.
  assert.doesNotMatch(svg, /stroke="#e5e7eb"\/><text [^>]*>(0|1\.0)</);
  // Labelled x ticks, to the last step.
  for (const label of ["0", "500", "1000", "1500", "2000", "2500", "3000"]) {
    assert.match(svg, new RegExp(`text-anchor="middle">${label}</text>`), `x tick ${label}`);
  }
  const rings = [...svg.matchAll(/<circle class="validation" cx="([\d.]+)" cy="([\d.]+)"/g)];
  assert.equal(rings.length, 1);
  assert.equal(Number(rings[0][1]), loss.vertices[299][0], "validation at the last step");
  const line = svg.match(/<line class="baseline" [^>]*y1="([\d.]+)"/);
  assert.ok(line, "the baseline is drawn");
  const [y24, y25] = [gridY(svg, "2.4"), gridY(svg, "2.6")];
  assert.ok(Math.abs(Number(line[1]) - (y24 + (y25 - y24) / 4)) < 0.11, "at 2.45");
  assert.match(svg, /bigram baseline 2\.450/);
  assert.match(svg, /validation loss 2\.400/);
  assert.match(svg, /tiny GPT &#60;AMP&#62;/, "the title is escaped");
  // The loss scale: every point, on a log axis labelled once per power of two.
  const scale = pathOf(svg, "loss-scale")!;
  assert.equal(scale.vertices.length, 300);
  assert.equal(scale.vertices[0][1] - scale.vertices[299][1] < 0, true, "the scale fell");
  const exponents = [...svg.matchAll(/>2<tspan dy="-5" font-size="9">(-?\d+)</g)].map((m) => m[1]);
  // 14…17 enclose the data; the scale's 2^15 lay along the baseline at 2.45, so one more
  // power below lifts it clear (the test below).
  assert.deepEqual(exponents, ["13", "14", "15", "16", "17"]);
});

Deno.test("plot: short, f32 and diverged runs", () => {
  const short = lossChartSvg({
    title: "one point",
    points: [{ step: 4, loss: 2.3, lossScale: 65536 }],
  });
  assert.equal(pathOf(short, "training-loss")!.vertices.length, 1);
  assert.equal((short.match(/<circle /g) ?? []).length, 1, "a lone point is a visible dot");
  const nearZero = lossChartSvg({
    title: "loss near 0",
    points: [{ step: 1, loss: 2.3, lossScale: 1 }, { step: 2, loss: 0.001, lossScale: 1 }],
  });
  assert.match(nearZero, />0<\/text>/);
  assert.doesNotMatch(nearZero, />-0\.5<\/text>/, "a loss axis never goes below 0 for losses ≥ 0");
  const f32 = lossChartSvg({
    title: "f32",
    points: [1, 2, 3].map((s) => ({ step: s * 50, loss: 1 / s, lossScale: 1 })),
  });
  assert.equal(pathOf(f32, "loss-scale"), null, "no loss scale without AMP");
  assert.doesNotMatch(f32, /loss scale/);
  const diverged = lossChartSvg({
    title: "diverged",
    points: [1, 2, 3, 4, 5].map((s) => ({ step: s, loss: s === 3 ? NaN : 1, lossScale: 1 })),
  });
  const broken = pathOf(diverged, "training-loss")!;
  assert.equal(broken.vertices.length, 4);
  assert.equal(broken.lines, 2, "the line breaks at the NaN");
  assert.match(diverged, /1 non-finite loss point\(s\) not drawn/);
  assert.doesNotMatch(diverged, /NaN/);
});

Deno.test("plot: the loss-scale line never runs along the baseline (issue 47: in gpt.svg a constant scale lay on the bigram line)", () => {
  const losses = Array.from({ length: 40 }, (_, i) => 3.3 - i * 0.03);
  // A constant scale (a short AMP run) and one that halves once, against baselines across the plot.
  const runs: [string, (i: number) => number][] = [
    ["constant 2^16", () => 65536],
    ["2^16 then 2^15", (i) => (i < 20 ? 65536 : 32768)],
  ];
  for (const [what, scaleAt] of runs) {
    for (let b = 0; b <= 60; b++) {
      const baseline = 2.1 + b * 0.02;
      const svg = lossChartSvg({
        title: "t",
        points: losses.map((loss, i) => ({ step: i + 1, loss, lossScale: scaleAt(i) })),
        baseline: { label: "bigram baseline", loss: baseline },
      });
      const at = Number(svg.match(/<line class="baseline" [^>]*y1="([\d.]+)"/)![1]);
      const ys = pathOf(svg, "loss-scale")!.vertices.map(([, y]) => y);
      const near = ys.filter((y) => Math.abs(y - at) < 8).length;
      assert.ok(near <= ys.length / 4, `${what}, baseline ${baseline}: ${near} points on it`);
      // Every label of the right axis lies on the plot.
      const labels = [...svg.matchAll(/<text x="[\d.]+" y="([\d.]+)" fill="#d97706">2</g)];
      assert.ok(labels.length >= 2 && labels.every((m) => Number(m[1]) > 0), `${what}: labels`);
    }
  }
});
