/**
 * A small SVG line chart of a training run, written by the examples'
 * `--plot PATH` (people would rather look than read): the training loss at
 * every logged step, the validation loss and a baseline where the script has
 * them, and (under AMP) the loss scale on a log axis at the right.
 *
 * @module
 */
import { linearScale, log2Scale, log2Ticks, niceTicks, type Scale, tickLabels } from "./axes.ts";

/** One logged point. */
export interface PlotPoint {
  /** Optimizer step or micro-batch count. */
  step: number;
  /** Mean training loss since the previous point. */
  loss: number;
  /** Loss scale at that point (1 without AMP). */
  lossScale: number;
}

/** What a chart shows. */
export interface LossChart {
  title: string;
  /** The training loss (and loss scale) at every logged step. */
  points: readonly PlotPoint[];
  /** Held-out loss at some steps, drawn as rings. */
  validation?: readonly { step: number; loss: number }[];
  /** A reference loss drawn as a horizontal line (the tiny GPT's bigram model). */
  baseline?: { label: string; loss: number };
}

const W = 800, H = 440, PAD = { left: 64, right: 76, top: 64, bottom: 48 };
const PLOT = { left: PAD.left, right: W - PAD.right, top: PAD.top, bottom: H - PAD.bottom };
const COLOR = { loss: "#2563eb", validation: "#059669", baseline: "#6b7280", scale: "#d97706" };
/** Up to this many points, each gets a dot (a short run's few points stay visible). */
const DOTS_UP_TO = 60;

/** `s` safe inside SVG text and attributes. */
export const escape = (s: string): string => s.replace(/[<>&"]/g, (c) => `&#${c.charCodeAt(0)};`);
/** A pixel coordinate as SVG writes it (one decimal). */
export const px = (v: number): string => v.toFixed(1);

/** An SVG path through the points; a non-finite y breaks the line there. */
function linePath(points: readonly [number, number][]): string {
  let pen = "M";
  const parts: string[] = [];
  for (const [x, y] of points) {
    if (!Number.isFinite(y)) {
      pen = "M";
      continue;
    }
    parts.push(`${pen}${px(x)},${px(y)}`);
    pen = "L";
  }
  return parts.join(" ");
}

/** Grid lines and labels of the left (loss) axis and the bottom (step) axis. */
function axes(x: Scale, xTicks: number[], y: Scale, yTicks: number[]): string {
  const xLabels = tickLabels(xTicks), yLabels = tickLabels(yTicks);
  const vertical = xTicks.map((t, i) =>
    `<line x1="${px(x(t))}" x2="${
      px(x(t))
    }" y1="${PLOT.top}" y2="${PLOT.bottom}" stroke="#f1f5f9"/>` +
    `<text x="${px(x(t))}" y="${PLOT.bottom + 16}" text-anchor="middle">${xLabels[i]}</text>`
  );
  const horizontal = yTicks.map((t, i) =>
    `<line x1="${PLOT.left}" x2="${PLOT.right}" y1="${px(y(t))}" y2="${
      px(y(t))
    }" stroke="#e5e7eb"/>` +
    `<text x="${PLOT.left - 8}" y="${px(y(t) + 4)}" text-anchor="end">${yLabels[i]}</text>`
  );
  const frame = `<rect x="${PLOT.left}" y="${PLOT.top}" width="${PLOT.right - PLOT.left}" ` +
    `height="${PLOT.bottom - PLOT.top}" fill="none" stroke="#9ca3af"/>`;
  return [...vertical, ...horizontal, frame].join("\n");
}

/** The right axis: the loss scale, one label per power of two ("2" with a raised exponent). */
function scaleAxis(y: Scale, exponents: number[]): string {
  return exponents.map((e) =>
    `<text x="${PLOT.right + 8}" y="${px(y(2 ** e) + 4)}" fill="${COLOR.scale}">2` +
    `<tspan dy="-5" font-size="9">${e}</tspan></text>`
  ).join("\n");
}

/** One legend entry a line: [colour, dash pattern or "dot"/"ring", text]. */
function legend(entries: [string, string, string][]): string {
  let left = PLOT.left;
  return entries.map(([color, style, text]) => {
    const swatch = style === "ring"
      ? `<circle cx="${left + 10}" cy="40" r="4" fill="white" stroke="${color}" stroke-width="2"/>`
      : `<line x1="${left}" x2="${left + 20}" y1="40" y2="40" stroke="${color}" stroke-width="2"` +
        (style ? ` stroke-dasharray="${style}"` : "") + "/>";
    const item = `${swatch}<text x="${left + 26}" y="44" fill="${color}">${escape(text)}</text>`;
    left += 40 + text.length * 6.5;
    return item;
  }).join("\n");
}

/** Pixels a dashed line must keep from another to be told apart. */
const CLEARANCE = 8;

/**
 * The right axis's exponents and scale for `scales`, widened (one power of
 * two at a time, on the side that moves the line away) until the loss-scale
 * line no longer runs along the baseline at `baselineAt` (a constant scale is
 * a horizontal line, which could lie on the baseline's): at most a quarter of
 * its points within {@link CLEARANCE} pixels of it (a line that crosses it
 * is fine).
 */
function scaleAxisClearOf(
  scales: number[],
  baselineAt: number | null,
): { exponents: number[]; yScale: Scale } {
  let exponents = log2Ticks(Math.log2(Math.min(...scales)), Math.log2(Math.max(...scales)));
  let [lo, hi] = [exponents[0], exponents.at(-1)!];
  for (let widen = 0;; widen++) {
    const yScale = log2Scale(lo, hi, PLOT.bottom, PLOT.top);
    const ys = scales.map(yScale);
    if (baselineAt === null) return { exponents, yScale };
    const near = ys.filter((v) => Math.abs(v - baselineAt) < CLEARANCE).length;
    if (near <= ys.length / 4 || widen === 8) return { exponents, yScale };
    // Below the baseline (larger y): a power above the data lowers the line; else one below.
    const mean = ys.reduce((a, b) => a + b, 0) / ys.length;
    if (mean >= baselineAt) hi++;
    else lo--;
    exponents = log2Ticks(lo + 1, hi - 1).filter((e) => e >= lo && e <= hi);
  }
}

/**
 * The chart as SVG text. The training loss is the first `<path d=…>` (tests
 * count its points).
 */
export function lossChartSvg(chart: LossChart): string {
  const { points, validation = [], baseline } = chart;
  const finite = (v: number) => Number.isFinite(v);
  const losses = [
    ...points.map((p) => p.loss),
    ...validation.map((v) => v.loss),
    ...(baseline ? [baseline.loss] : []),
  ].filter(finite);
  const steps = [...points, ...validation].map((p) => p.step);
  const xTicks = niceTicks(0, Math.max(1, ...steps));
  const x = linearScale(xTicks[0], xTicks.at(-1)!, PLOT.left, PLOT.right);
  const [lo, hi] = [Math.min(...losses), Math.max(...losses)], margin = (hi - lo) * 0.02;
  // A little room, so that the lowest and highest points do not lie on the frame.
  const yTicks = losses.length
    ? niceTicks(lo >= 0 ? Math.max(0, lo - margin) : lo - margin, hi + margin)
    : [0, 1];
  const y = linearScale(yTicks[0], yTicks.at(-1)!, PLOT.bottom, PLOT.top);
  const scales = points.map((p) => p.lossScale).filter((s) => finite(s) && s > 0);
  const showScale = scales.some((s) => s !== 1); // all 1: AMP off, nothing to show
  const baselineAt = baseline && finite(baseline.loss) ? y(baseline.loss) : null;
  const { exponents, yScale } = scaleAxisClearOf(scales, baselineAt);
  const hidden = points.filter((p) => !finite(p.loss)).length;

  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12" fill="#374151">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${W / 2}" y="20" text-anchor="middle" font-size="14">${escape(chart.title)}</text>`,
    axes(x, xTicks, y, yTicks),
    `<path d="${
      linePath(points.map((p) => [x(p.step), y(p.loss)]))
    }" id="training-loss" fill="none" stroke="${COLOR.loss}" stroke-width="2"/>`,
  ];
  if (points.length <= DOTS_UP_TO) {
    parts.push(
      ...points.filter((p) => finite(p.loss)).map((p) =>
        `<circle cx="${px(x(p.step))}" cy="${px(y(p.loss))}" r="2.5" fill="${COLOR.loss}"/>`
      ),
    );
  }
  const entries: [string, string, string][] = [[COLOR.loss, "", "training loss"]];
  if (baseline && baselineAt !== null) {
    const at = px(baselineAt);
    parts.push(
      `<line class="baseline" x1="${PLOT.left}" x2="${PLOT.right}" y1="${at}" y2="${at}" ` +
        `stroke="${COLOR.baseline}" stroke-width="1.5" stroke-dasharray="8 4"/>`,
    );
    entries.push([COLOR.baseline, "8 4", `${baseline.label} ${baseline.loss.toFixed(3)}`]);
  }
  for (const v of validation.filter((v) => finite(v.loss))) {
    parts.push(
      `<circle class="validation" cx="${px(x(v.step))}" cy="${px(y(v.loss))}" r="4.5" ` +
        `fill="white" stroke="${COLOR.validation}" stroke-width="2"/>`,
    );
  }
  if (validation.length) {
    const last = validation.at(-1)!;
    entries.push([COLOR.validation, "ring", `validation loss ${last.loss.toFixed(3)}`]);
  }
  if (showScale) {
    parts.push(
      `<path d="${
        linePath(points.map((p) => [x(p.step), p.lossScale > 0 ? yScale(p.lossScale) : NaN]))
      }" id="loss-scale" fill="none" stroke="${COLOR.scale}" stroke-width="1.5" stroke-dasharray="5 3"/>`,
      scaleAxis(yScale, exponents),
    );
    entries.push([COLOR.scale, "5 3", "loss scale (right, log)"]);
  }
  parts.push(
    legend(entries),
    `<text x="${(PLOT.left + PLOT.right) / 2}" y="${H - 10}" text-anchor="middle">step` +
      (hidden ? ` (${hidden} non-finite loss point(s) not drawn)` : "") + "</text>",
    `<text transform="translate(16 ${(PLOT.top + PLOT.bottom) / 2}) rotate(-90)" ` +
      `text-anchor="middle">loss (nats)</text>`,
    "</svg>",
  );
  return parts.join("\n") + "\n";
}

/** Writes the chart to `path` atomically (temporary file, then rename). */
export function writeLossChart(path: string, chart: LossChart): Promise<void> {
  return writeSvg(path, lossChartSvg(chart));
}

/** Writes `svg` to `path` atomically (temporary file, then rename). */
export async function writeSvg(path: string, svg: string): Promise<void> {
  const tmp = `${path}.tmp-${crypto.randomUUID()}`;
  try {
    await Deno.writeTextFile(tmp, svg);
    await Deno.rename(tmp, path);
  } catch (e) {
    await Deno.remove(tmp).catch(() => {});
    throw e;
  }
}
