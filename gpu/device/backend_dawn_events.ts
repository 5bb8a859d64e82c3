/**
 * How dawn.node's events are pumped, made gentle and finished at exit.
 *
 * Polling. While any of its promises is
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
 *
 * Exit. dawn.node aborts the process (SIGABRT, "Promise not resolved or
 * rejected") when one of its promises is finalized while still pending. A
 * program that ends normally keeps polling until they settle, but `deno test`
 * ends each test file's worker as soon as its tests are done: a file whose last
 * test left an error scope or a submit in flight took the whole run down (it
 * looked like resources piling up across files; it was the last test of
 * tests/amp/grad_scaler_test.ts, every time). So when the worker unloads, Dawn's
 * ticks run at once until none is left to run ({@link settle}): nothing is
 * pending when the worker's objects are finalized. (Destroying the devices
 * there instead crashed dawn.node outright.)
 */

/** Ticks of one wait that poll at once. */
export const FAST_TICKS = 8;
/** The delay of every later tick of the wait, in milliseconds. */
export const SLOW_TICK_MS = 1;

let installed = false;
/** The tick dawn.node last scheduled and that has not run yet, if any. */
let scheduled: (() => void) | null = null;

/**
 * Installs the wrapper of `globalThis.setImmediate` and the settling at
 * unload (once per worker; a runtime without `setImmediate` is left alone).
 */
export function pumpDawnEvents(): void {
  // deno-lint-ignore no-explicit-any
  const global = globalThis as any;
  if (installed || typeof global.setImmediate !== "function") return;
  installed = true;
  globalThis.addEventListener?.("unload", settle);
  const immediate = global.setImmediate as (fn: () => void, ...args: unknown[]) => unknown;
  // Ticks of the current wait: a tick scheduled from inside a tick continues the wait.
  let ticks = 0, inTick = false;
  global.setImmediate = (fn: () => void, ...args: unknown[]): unknown => {
    if (!isDawnTick(fn, args)) return immediate(fn, ...args);
    ticks = inTick ? ticks + 1 : 0;
    const tick = () => {
      if (scheduled !== tick) return; // already run by settle()
      scheduled = null;
      inTick = true;
      try {
        fn();
      } finally {
        inTick = false;
      }
    };
    scheduled = tick;
    return ticks < FAST_TICKS ? immediate(tick) : setTimeout(tick, SLOW_TICK_MS);
  };
}

/** A callback dawn.node schedules: a native function (Node-API), no arguments. */
function isDawnTick(fn: unknown, args: unknown[]): boolean {
  return typeof fn === "function" && args.length === 0 &&
    Function.prototype.toString.call(fn).includes("[native code]");
}

/** How long the worker's end may wait for Dawn to settle what is in flight. */
const SETTLE_MS = 10_000;

/**
 * Runs dawn.node's ticks at once, one after the other, until none is
 * scheduled (no promise of Dawn's is pending) or {@link SETTLE_MS} passed.
 */
function settle(): void {
  const deadline = performance.now() + SETTLE_MS;
  while (scheduled !== null && performance.now() < deadline) scheduled();
}
