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

/** How an example prints one event: a JSON line with --json, else `text`. */
export type PhaseEmit = (event: string, fields: Record<string, unknown>, text: string) => void;

/**
 * The first training step of a session, said before and after: recording it
 * compiles its kernels (seconds on a GPU, a minute or two for a CNN on a CPU
 * adapter), and a piped run would otherwise print nothing until its first
 * log line. Nothing waits for the GPU: "recorded" is when the step's
 * dispatches were recorded.
 */
export class FirstStep {
  #started = 0;
  #state: "before" | "running" | "done" = "before";

  constructor(readonly emit: PhaseEmit, readonly logEvery: number) {}

  /** Before each step: the first one is announced. */
  before(): void {
    if (this.#state !== "before") return;
    this.#state = "running";
    this.#started = performance.now();
    this.emit(
      "phase",
      { phase: "first step" },
      "first step: compiling its kernels (on a CPU adapter this takes a while)...",
    );
  }

  /** After each step: the first one says how long it took and when the next line comes. */
  after(): void {
    if (this.#state !== "running") return;
    this.#state = "done";
    const seconds = (performance.now() - this.#started) / 1000;
    this.emit(
      "phase",
      { phase: "training", firstStepSeconds: seconds },
      `first step recorded in ${seconds.toFixed(1)} s; training (a line every ${this.logEvery} ` +
        "steps)",
    );
  }
}
