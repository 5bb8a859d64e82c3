/**
 * A small SVG line chart of training loss and loss scale over steps, written
 * by the examples' `--plot PATH` (people would rather look than read).
 */

/** One logged point. */
export interface PlotPoint {
  /** Optimizer step or micro-batch count. */
  step: number;
  /** Mean training loss since the previous point. */
  loss: number;
  /** Loss scale at that point (1 without AMP). */
  lossScale: number;
}

const W = 720, H = 360, PAD = { left: 64, right: 72, top: 36, bottom: 44 };

function scaleLinear(lo: number, hi: number, a: number, b: number): (v: number) => number {
  const span = hi - lo || 1;
  return (v) => a + ((v - lo) / span) * (b - a);
}

function path(points: [number, number][]): string {
  return points.map(([x, y], i) => `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
}

const escape = (s: string) => s.replace(/[<>&"]/g, (c) => `&#${c.charCodeAt(0)};`);

/** The chart as SVG text: loss on the left axis, log2 of the loss scale on the right. */
export function lossChartSvg(points: readonly PlotPoint[], title: string): string {
  const steps = points.map((p) => p.step), losses = points.map((p) => p.loss);
  const scales = points.map((p) => Math.log2(Math.max(p.lossScale, 1e-30)));
  const x = scaleLinear(Math.min(0, ...steps), Math.max(1, ...steps), PAD.left, W - PAD.right);
  const yLoss = scaleLinear(0, Math.max(...losses, 1e-9) * 1.05, H - PAD.bottom, PAD.top);
  const sLo = Math.min(...scales) - 1, sHi = Math.max(...scales) + 1;
  const yScale = scaleLinear(sLo, sHi, H - PAD.bottom, PAD.top);
  const lossTicks = [0, 0.25, 0.5, 0.75, 1].map((f) => f * Math.max(...losses, 1e-9) * 1.05);
  const grid = lossTicks.map((v) =>
    `<line x1="${PAD.left}" x2="${W - PAD.right}" y1="${yLoss(v)}" y2="${
      yLoss(v)
    }" stroke="#e5e7eb"/>` +
    `<text x="${PAD.left - 8}" y="${yLoss(v) + 4}" text-anchor="end">${v.toFixed(2)}</text>`
  ).join("");
  const scaleLabels = [sLo + 1, sHi - 1].map((v) =>
    `<text x="${W - PAD.right + 8}" y="${yScale(v) + 4}" fill="#d97706">2^${v.toFixed(0)}</text>`
  ).join("");
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">
<rect width="${W}" height="${H}" fill="white"/>
<text x="${W / 2}" y="20" text-anchor="middle" font-size="14">${escape(title)}</text>
${grid}${scaleLabels}
<line x1="${PAD.left}" x2="${W - PAD.right}" y1="${H - PAD.bottom}" y2="${
    H - PAD.bottom
  }" stroke="#6b7280"/>
<text x="${W / 2}" y="${H - 10}" text-anchor="middle">step (last: ${Math.max(0, ...steps)})</text>
<path d="${
    path(points.map((p) => [x(p.step), yLoss(p.loss)]))
  }" fill="none" stroke="#2563eb" stroke-width="2"/>
<path d="${
    path(points.map((p, i) => [x(p.step), yScale(scales[i])]))
  }" fill="none" stroke="#d97706" stroke-width="1.5" stroke-dasharray="5 3"/>
<text x="${PAD.left}" y="${PAD.top - 8}" fill="#2563eb">training loss</text>
<text x="${W - PAD.right}" y="${PAD.top - 8}" fill="#d97706" text-anchor="end">loss scale</text>
</svg>
`;
}

/** Writes the chart to `path` atomically (temporary file, then rename). */
export async function writeLossChart(
  path: string,
  points: readonly PlotPoint[],
  title: string,
): Promise<void> {
  const tmp = `${path}.tmp-${crypto.randomUUID()}`;
  try {
    await Deno.writeTextFile(tmp, lossChartSvg(points, title));
    await Deno.rename(tmp, path);
  } catch (e) {
    await Deno.remove(tmp).catch(() => {});
    throw e;
  }
}
