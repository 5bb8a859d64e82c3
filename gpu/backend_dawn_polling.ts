/**
 * How dawn.node waits for the GPU, made gentle. While any of its promises is
 * pending (a buffer read, `onSubmittedWorkDone`, an error scope, a pipeline),
 * dawn.node (0.6.2, `AsyncRunner::ScheduleProcessEvents`) calls
 * `instance.ProcessEvents()` from a `setImmediate` callback that schedules the
 * next one: a busy loop that keeps a CPU core at 100% for as long as the GPU
 * works. On a CPU adapter (lavapipe) that core is one the GPU itself needed.
 *
 * dawn.node looks `setImmediate` up on the global object every time, so
 * {@link throttleDawnPolling} wraps it: the first {@link FAST_TICKS} ticks of
 * one wait run at once (a short wait stays short), every later one after
 * {@link SLOW_TICK_MS}. Only Dawn's ticks are touched: callbacks that are
 * native functions, called with no arguments. Measured on lavapipe (2 vCPUs,
 * shared): ten 512³ matmuls each read back took 15.8–20.0 s polling at once,
 * 8.5–10.2 s so (Deno's WebGPU: 6.9–7.7 s), and pipeline compiles (the first
 * dispatch of a kernel) were slowed alike.
 */

/** Ticks of one wait that poll at once. */
export const FAST_TICKS = 8;
/** The delay of every later tick of the wait, in milliseconds. */
export const SLOW_TICK_MS = 1;

let installed = false;

/**
 * Installs the wrapper of `globalThis.setImmediate` (once per process; a
 * runtime without `setImmediate` is left alone).
 */
export function throttleDawnPolling(): void {
  // deno-lint-ignore no-explicit-any
  const global = globalThis as any;
  if (installed || typeof global.setImmediate !== "function") return;
  installed = true;
  const immediate = global.setImmediate as (fn: () => void, ...args: unknown[]) => unknown;
  // Ticks of the current wait: a tick scheduled from inside a tick continues the wait.
  let ticks = 0, inTick = false;
  global.setImmediate = (fn: () => void, ...args: unknown[]): unknown => {
    if (!isDawnTick(fn, args)) return immediate(fn, ...args);
    ticks = inTick ? ticks + 1 : 0;
    const tick = () => {
      inTick = true;
      try {
        fn();
      } finally {
        inTick = false;
      }
    };
    return ticks < FAST_TICKS ? immediate(tick) : setTimeout(tick, SLOW_TICK_MS);
  };
}

/** A callback dawn.node schedules: a native function (Node-API), no arguments. */
function isDawnTick(fn: unknown, args: unknown[]): boolean {
  return typeof fn === "function" && args.length === 0 &&
    Function.prototype.toString.call(fn).includes("[native code]");
}
