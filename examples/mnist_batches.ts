/**
 * The MNIST data as `mnist.ts` feeds it to the model: standardised pixels, a
 * seeded shuffle every epoch and fixed-size batches (the last partial batch of
 * an epoch is dropped), like a torch DataLoader with `shuffle=True,
 * drop_last=True`.
 *
 * @module
 */
import type { RandomGenerator } from "../mod.ts";
import { loadMnist, type Mnist, MNIST_PIXELS, type MnistSplit } from "./mnist_data.ts";

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
    for (let i = 0; i < split.images.length; i++) {
      split.images[i] = (split.images[i] - 0.1307) / 0.3081;
    }
  }
  return data;
}

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

/** Copies examples `order[from..from+n)` into a batch: pixels and class ids. */
export function gather(
  data: MnistSplit,
  order: Uint32Array,
  from: number,
  n: number,
  pixels: Float32Array,
  labels: Int32Array,
): void {
  for (let i = 0; i < n; i++) {
    const e = order[from + i];
    pixels.set(data.images.subarray(e * MNIST_PIXELS, (e + 1) * MNIST_PIXELS), i * MNIST_PIXELS);
    labels[i] = data.labels[e];
  }
}
