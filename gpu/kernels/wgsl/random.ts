/**
 * A counter-based random number generator: the n-th number of a stream is a
 * pure function of (key, counter), computed the same way in TypeScript and in
 * WGSL, so kernels draw the numbers the host would. The mixing function is two
 * rounds of the "lowbias32" integer hash. Streams and their state are
 * gpu/tensor/random.ts's `RandomGenerator`.
 */

/** One round of the lowbias32 hash (u32 → u32). */
export function hashU32(value: number): number {
  let x = value >>> 0;
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

/** The random u32 at `counter` of the stream `key`. */
export function randomU32(key: number, counter: number): number {
  return hashU32(hashU32((counter + Math.imul(key, 0x9e3779b9)) >>> 0) ^ key);
}

/** A uniform number in [0, 1) with 24 random bits (exact in f32). */
export function randomUniform(key: number, counter: number): number {
  return (randomU32(key, counter) >>> 8) / 16777216;
}

/** The same functions in WGSL: `random_u32(key, counter)` and `random_uniform(key, counter)`. */
export const WGSL_RANDOM = `fn hash_u32(v: u32) -> u32 {
  var x = v;
  x ^= x >> 16u;
  x *= 0x7feb352du;
  x ^= x >> 15u;
  x *= 0x846ca68bu;
  x ^= x >> 16u;
  return x;
}
fn random_u32(key: u32, counter: u32) -> u32 {
  return hash_u32(hash_u32(counter + key * 0x9e3779b9u) ^ key);
}
fn random_uniform(key: u32, counter: u32) -> f32 {
  return f32(random_u32(key, counter) >> 8u) * (1.0 / 16777216.0);
}
`;

/** A block of random numbers reserved from a {@link RandomGenerator}. */
export interface RandomRange {
  /** Stream key. */
  key: number;
  /** First counter of the block. */
  counter: number;
}
