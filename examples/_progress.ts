/**
 * A one-line progress bar with the time left, for terminals; nothing
 * elsewhere (pipes, CI, --json print their own lines). Every long phase
 * draws one (training step by step, evaluation batch by batch), so a run
 * never sits silent until its next log line.
 */

/** Where a bar is drawn (a terminal's stdout by default; tests give their own). */
export interface ProgressOutput {
  /** Whether bars are drawn at all. */
  terminal: boolean;
  /** Writes raw text (a carriage return redraws the line). */
  write(text: string): void;
}

const stdoutOutput = (): ProgressOutput => ({
  terminal: Deno.stdout.isTerminal(),
  write: (text) => void Deno.stdout.writeSync(new TextEncoder().encode(text)),
});

/** Redraws at most this often (a step can take a millisecond). */
const REDRAW_MS = 100;

/** Writes progress: redraws one line on a terminal, prints nothing elsewhere. */
export class Progress {
  readonly #output: ProgressOutput;
  #drawn = false;
  #lastDraw = -Infinity;
  #start: { time: number; done: number } | null = null;

  /** A progress display; `enabled` false (e.g. --json) never draws the bar. */
  constructor(enabled: boolean, output: ProgressOutput = stdoutOutput()) {
    this.#output = { ...output, terminal: enabled && output.terminal };
  }

  /** True when updates redraw a bar instead of printing lines. */
  get isBar(): boolean {
    return this.#output.terminal;
  }

  /**
   * The time left at the pace since the first update, as "ETA m:ss" (empty
   * until there is a pace to go by).
   */
  eta(done: number, total: number): string {
    const now = performance.now();
    if (!this.#start) {
      this.#start = { time: now, done };
      return "";
    }
    const rate = (done - this.#start.done) / (now - this.#start.time);
    if (!(rate > 0)) return "";
    const seconds = Math.round((total - done) / rate / 1000);
    return `ETA ${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`;
  }

  /** Redraws the bar: `done` of `total`, then `text` and the time left (throttled, the end always). */
  update(done: number, total: number, text: string): void {
    if (!this.#output.terminal) return;
    const eta = this.eta(done, total), now = performance.now();
    if (now - this.#lastDraw < REDRAW_MS && done < total) return;
    this.#lastDraw = now;
    const width = 24, filled = Math.round((Math.min(done, total) / Math.max(total, 1)) * width);
    const bar = "█".repeat(filled) + "░".repeat(width - filled);
    const line = `\r${bar} ${String(done).padStart(String(total).length)}/${total} ${text}` +
      (eta ? `  ${eta}` : "");
    this.#output.write(`${line}\x1b[K`);
    this.#drawn = true;
  }

  /**
   * Ends the bar's line so the next output starts on a fresh one. The pace
   * is kept: a training bar's time left after an evaluation counts it too.
   */
  finish(): void {
    if (this.#drawn) this.#output.write("\n");
    this.#drawn = false;
    this.#lastDraw = -Infinity;
  }
}
