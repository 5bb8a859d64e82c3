/**
 * `--profile N` for the examples: profiles training steps `first` to
 * `first + N − 1` with `gpu.profile` and hands back the report. The window
 * starts after a few warm-up steps (pipelines compiled, buffers pooled) so it
 * shows the steady state. `HALFSTEP_PROFILE=N` in the environment does the
 * same when the flag is not given.
 */
import type { Gpu, ProfileReport } from "../../mod.ts";

/** The step a window starts at, when the run is long enough. */
const FIRST_STEP = 11;

/** N from `--profile N`, else from `HALFSTEP_PROFILE` (read only if the runtime grants it). */
export function profileSteps(flag: number | undefined): number | undefined {
  if (flag !== undefined) return flag;
  try {
    const state = Deno.permissions.querySync({ name: "env", variable: "HALFSTEP_PROFILE" }).state;
    if (state !== "granted") return undefined;
    const n = Number(Deno.env.get("HALFSTEP_PROFILE"));
    return Number.isInteger(n) && n >= 1 ? n : undefined;
  } catch {
    return undefined;
  }
}

/** Profiles a window of consecutive steps of a training loop. */
export class ProfileWindow {
  /** The first profiled step (1-based). */
  readonly first: number;
  /** The last profiled step. */
  readonly last: number;
  #gpu: Gpu;
  #finish: (() => void) | null = null;
  #report: Promise<ProfileReport> | null = null;

  /** A window of `steps` steps in a run of `totalSteps`. */
  constructor(gpu: Gpu, steps: number, totalSteps: number) {
    this.#gpu = gpu;
    this.first = totalSteps >= FIRST_STEP + steps - 1 ? FIRST_STEP : 1;
    this.last = Math.min(this.first + steps - 1, totalSteps);
  }

  /** Call before step `step` runs: the window opens at its first step. */
  before(step: number): void {
    if (step !== this.first) return;
    // gpu.profile attaches the profiler synchronously, then waits for `done`.
    const done = new Promise<void>((resolve) => (this.#finish = resolve));
    this.#report = this.#gpu.profile(() => done, { print: false });
  }

  /** Call after step `step` ran: at the window's last step, the report (a GPU sync). */
  async after(step: number): Promise<ProfileReport | null> {
    if (step !== this.last || !this.#finish) return null;
    this.#finish();
    this.#finish = null;
    return await this.#report;
  }
}

/** The report as an event's fields (`--json`): totals and every row. */
export function profileFields(report: ProfileReport, first: number, last: number) {
  return {
    fromStep: first,
    toStep: last,
    timing: report.timing,
    dispatches: report.dispatches,
    gpuMs: report.gpuMs,
    wallMs: report.wallMs,
    rows: report.rows,
  };
}
