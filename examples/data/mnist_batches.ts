/**
 * The MNIST data as `mnist.ts` feeds it to the model: standardised pixels, a
 * seeded shuffle every epoch, optional random translations of the training
 * images, and fixed-size batches (the last partial batch of an epoch is
 * dropped), like a torch DataLoader with `shuffle=True, drop_last=True` and a
 * `RandomAffine(0, translate=...)` transform.
 *
 * @module
 */
import type { RandomGenerator } from "../../mod.ts";
import { loadMnist, type Mnist, MNIST_PIXELS, type MnistSplit } from "./mnist.ts";

/**
 * MNIST from `--data-dir` (first `--limit` training images), pixels
 * standardised. Prints the problem and exits with status 1 when the files are
 * missing or malformed.
 */
export async function loadData(options: { dataDir?: string; limit?: number }): Promise<Mnist> {
  let data: Mnist;
  try {
    data = await loadMnist({ dir: options.dataDir, limit: options.limit });
  } catch (e) {
    // Missing or malformed files: the message names the file and what is wrong.
    console.error(`mnist: ${e instanceof Error ? e.message : e}`);
    Deno.exit(1);
  }
  // Standardise pixels with MNIST's mean and deviation: well-scaled inputs train faster.
  for (const split of [data.train, data.test]) {
    for (let i = 0; i < split.images.length; i++) split.images[i] = standardised(split.images[i]);
  }
  return data;
}

function standardised(pixel: number): number {
  return (pixel - 0.1307) / 0.3081;
}

/** MNIST's image side. */
const SIDE = 28;

/**
 * A Fisher–Yates shuffle of 0..count-1 with the seeded generator: the order
 * depends on the generator's state alone, which the saved training state holds.
 */
export function shuffle(count: number, rng: RandomGenerator): Uint32Array {
  const order = Uint32Array.from({ length: count }, (_, i) => i);
  const draws = rng.uniform(count);
  for (let i = count - 1; i > 0; i--) {
    const j = Math.floor(draws[i] * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order;
}

/**
 * A random translation of each of `count` examples by up to `max` pixels
 * along each axis, [dy, dx] pairs drawn from the seeded generator (so the
 * saved training state reproduces them).
 */
export function randomShifts(count: number, max: number, rng: RandomGenerator): Int8Array {
  const draws = rng.uniform(2 * count);
  return Int8Array.from(draws, (u) => Math.min(Math.floor(u * (2 * max + 1)), 2 * max) - max);
}

/** `src` (one image) moved by (dy, dx) into `dst`; pixels moved in from outside are background. */
function copyShifted(src: Float32Array, dst: Float32Array, at: number, dy: number, dx: number) {
  const background = standardised(0);
  for (let y = 0; y < SIDE; y++) {
    for (let x = 0; x < SIDE; x++) {
      const sy = y - dy, sx = x - dx;
      const inside = sy >= 0 && sy < SIDE && sx >= 0 && sx < SIDE;
      dst[at + y * SIDE + x] = inside ? src[sy * SIDE + sx] : background;
    }
  }
}

/**
 * Copies examples `order[from..from+n)` into a batch: pixels and class ids;
 * with `shifts` (from {@link randomShifts}, indexed by example) each image is
 * translated first.
 */
export function gather(
  data: MnistSplit,
  order: Uint32Array,
  from: number,
  n: number,
  pixels: Float32Array,
  labels: Int32Array,
  shifts: Int8Array | null = null,
): void {
  for (let i = 0; i < n; i++) {
    const e = order[from + i];
    const image = data.images.subarray(e * MNIST_PIXELS, (e + 1) * MNIST_PIXELS);
    if (shifts) copyShifted(image, pixels, i * MNIST_PIXELS, shifts[2 * e], shifts[2 * e + 1]);
    else pixels.set(image, i * MNIST_PIXELS);
    labels[i] = data.labels[e];
  }
}
