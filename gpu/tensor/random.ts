/**
 * Seeded random streams and the tape that replays their draws. The numbers
 * themselves are a pure function of (key, counter), computed the same way in
 * TypeScript and in WGSL (gpu/kernels/wgsl/random.ts): a dropout mask is
 * therefore never stored, since backward (and a checkpointed recompute)
 * regenerates it exactly from the same key and offset.
 */
import { fail, StateError, ValueError } from "../base/errors.ts";
import { hashU32, type RandomRange, randomUniform } from "../kernels/wgsl/random.ts";
import { runtime } from "./runtime_state.ts";

const COUNTERS_PER_KEY = 2 ** 32;

/** A {@link RandomGenerator}'s whole state: PyTorch's Philox (seed, offset). */
export interface RandomState {
  /** The seed, a non-negative safe integer. */
  seed: number;
  /** How many numbers have been taken, a non-negative safe integer. */
  offset: number;
}

/**
 * Throws a ValueError (opening with `where`) unless `state` is a valid
 * {@link RandomState}; values are described, not echoed, when they are not numbers.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { ValueError } from "../base/errors.ts";
 * import { checkRandomState } from "./random.ts";
 * checkRandomState("resume", { seed: 7, offset: 4096 }); // fine
 * assert.throws(() => checkRandomState("resume", { seed: 7, offset: -1 }), ValueError);
 * ```
 */
export function checkRandomState(where: string, state: RandomState): void {
  const valid = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 0;
  if (typeof state !== "object" || state === null || !valid(state.seed) || !valid(state.offset)) {
    const show = (v: unknown) => typeof v === "number" ? String(v) : typeof v;
    fail(
      ValueError,
      where,
      `seed (${show(state?.seed)}) and offset (${
        show(state?.offset)
      }) must be non-negative integers.`,
    );
  }
}

/**
 * A seeded stream of random numbers, like PyTorch's Philox (seed, offset)
 * state. `take(n)` reserves n consecutive counters; the state is two numbers,
 * so it can be saved and restored for an exact resume.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { RandomGenerator } from "./random.ts";
 * import { randomUniform } from "../kernels/wgsl/random.ts";
 * const rng = new RandomGenerator(42);
 * const { key, counter } = rng.take(3);
 * const first = randomUniform(key, counter); // the same on the GPU for (key, counter)
 * assert.ok(first >= 0);
 * assert.ok(first < 1);
 * ```
 */
export class RandomGenerator {
  /** How many numbers have been taken so far. */
  offset: number;
  #seed: number;

  /** A stream for `seed`, starting at `offset` (0 for a fresh one). */
  constructor(seed: number, offset = 0) {
    checkRandomState("RandomGenerator", { seed, offset });
    this.#seed = seed;
    this.offset = offset;
  }

  /** The seed (a non-negative integer). */
  get seed(): number {
    return this.#seed;
  }

  /** Reserves `count` consecutive numbers (they never straddle two keys). */
  take(count: number): RandomRange {
    const tape = runtime.randomTape;
    const replayed = tape?.answer(this, count);
    if (replayed) return replayed;
    let start = this.offset;
    const within = start % COUNTERS_PER_KEY;
    if (within + count > COUNTERS_PER_KEY) start += COUNTERS_PER_KEY - within;
    this.offset = start + count;
    const range = {
      key: this.#keyFor(Math.floor(start / COUNTERS_PER_KEY)),
      counter: start % COUNTERS_PER_KEY,
    };
    tape?.noteDraw(this, count, range);
    runtime.stepRecorder?.noteDraw(this, count, range);
    return range;
  }

  /** `count` uniform numbers in [lo, hi) computed on the CPU (parameter initialisation). */
  uniform(count: number, lo = 0, hi = 1): Float32Array {
    const { key, counter } = this.take(count);
    const out = new Float32Array(count);
    for (let i = 0; i < count; i++) out[i] = lo + (hi - lo) * randomUniform(key, counter + i);
    return out;
  }

  /** `count` normal numbers N(mean, std²) by Box-Muller on the CPU. */
  normal(count: number, mean = 0, std = 1): Float32Array {
    const u = this.uniform(2 * Math.ceil(count / 2));
    const out = new Float32Array(count);
    for (let i = 0; i < count; i += 2) {
      const r = Math.sqrt(-2 * Math.log(1 - u[i])), theta = 2 * Math.PI * u[i + 1];
      out[i] = mean + std * r * Math.cos(theta);
      if (i + 1 < count) out[i + 1] = mean + std * r * Math.sin(theta);
    }
    return out;
  }

  /** The state to save: seed and offset. */
  state(): RandomState {
    return { seed: this.#seed, offset: this.offset };
  }

  /**
   * Continues the stream `state` describes (a resumed run draws the numbers
   * the interrupted one would have drawn next). Checked first: a bad state
   * throws and changes nothing.
   */
  setState(state: RandomState): void {
    checkRandomState("RandomGenerator.setState", state);
    this.#seed = state.seed;
    this.offset = state.offset;
  }

  #keyFor(block: number): number {
    return hashU32(
      hashU32(this.seed % COUNTERS_PER_KEY) ^
        hashU32(Math.floor(this.seed / COUNTERS_PER_KEY) + block * 0x632be5ab),
    );
  }
}

/**
 * The random ranges drawn while a region ran, in order, so that a recompute
 * of the region (gradient checkpointing) draws exactly the same numbers —
 * the same dropout masks — without moving any generator forward again.
 * Install it as the runtime's `randomTape` (see `withState`): it records
 * draws until {@link RandomTape.startReplay}, then answers them in order.
 */
export class RandomTape {
  #draws: { generator: RandomGenerator; count: number; range: RandomRange }[] = [];
  #next = 0;
  #replaying = false;

  /** From now on, answer draws from the recording, from its first draw. Returns this. */
  startReplay(): this {
    this.#replaying = true;
    this.#next = 0;
    return this;
  }

  /** A draw while recording. @internal */
  noteDraw(generator: RandomGenerator, count: number, range: RandomRange): void {
    if (!this.#replaying) this.#draws.push({ generator, count, range });
  }

  /** The recorded answer to a draw while replaying, else undefined. @internal */
  answer(generator: RandomGenerator, count: number): RandomRange | undefined {
    if (!this.#replaying) return undefined;
    const draw = this.#draws[this.#next++];
    if (!draw || draw.generator !== generator || draw.count !== count) {
      fail(
        StateError,
        "RandomTape",
        "the recomputed region drew different random numbers than the first run " +
          `(draw ${this.#next}: ${count} numbers); it must run the same ops in the same order.`,
      );
    }
    return draw.range;
  }
}
