/** A one-line progress bar for terminals; plain lines elsewhere (pipes, CI, --json). */

/** Writes progress: redraws one line on a terminal, prints lines otherwise. */
export class Progress {
  readonly #terminal: boolean;
  #drawn = false;

  /** A progress display; `enabled` false (e.g. --json) never draws the bar. */
  constructor(enabled: boolean) {
    this.#terminal = enabled && Deno.stdout.isTerminal();
  }

  /** True when updates redraw a bar instead of printing lines. */
  get isBar(): boolean {
    return this.#terminal;
  }

  /** Redraws the bar: `done` of `total`, then `text`. */
  update(done: number, total: number, text: string): void {
    if (!this.#terminal) return;
    const width = 24, filled = Math.round((done / Math.max(total, 1)) * width);
    const bar = "█".repeat(filled) + "░".repeat(width - filled);
    const line = `\r${bar} ${String(done).padStart(String(total).length)}/${total} ${text}`;
    Deno.stdout.writeSync(new TextEncoder().encode(`${line}\x1b[K`));
    this.#drawn = true;
  }

  /** Ends the bar's line so the next output starts on a fresh one. */
  finish(): void {
    if (this.#drawn) Deno.stdout.writeSync(new TextEncoder().encode("\n"));
    this.#drawn = false;
  }
}
