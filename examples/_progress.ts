/** A one-line progress bar for terminals; plain lines elsewhere (pipes, CI, --json). */

/** Writes progress: redraws one line on a terminal, prints lines otherwise. */
export class Progress {
  readonly #terminal: boolean;
  #drawn = false;
  #start: { time: number; done: number } | null = null;

  /** A progress display; `enabled` false (e.g. --json) never draws the bar. */
  constructor(enabled: boolean) {
    this.#terminal = enabled && Deno.stdout.isTerminal();
  }

  /** True when updates redraw a bar instead of printing lines. */
  get isBar(): boolean {
    return this.#terminal;
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

  /** Redraws the bar: `done` of `total`, then `text` and the time left. */
  update(done: number, total: number, text: string): void {
    if (!this.#terminal) return;
    const width = 24, filled = Math.round((done / Math.max(total, 1)) * width);
    const bar = "█".repeat(filled) + "░".repeat(width - filled);
    const eta = this.eta(done, total);
    const line = `\r${bar} ${String(done).padStart(String(total).length)}/${total} ${text}` +
      (eta ? `  ${eta}` : "");
    Deno.stdout.writeSync(new TextEncoder().encode(`${line}\x1b[K`));
    this.#drawn = true;
  }

  /** Ends the bar's line so the next output starts on a fresh one. */
  finish(): void {
    if (this.#drawn) Deno.stdout.writeSync(new TextEncoder().encode("\n"));
    this.#drawn = false;
  }
}
