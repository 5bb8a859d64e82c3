/**
 * The two MNIST models of `mnist.ts` (and `deno task bench mlp|cnn`): the
 * 784-256-256-10 MLP and a small CNN, each with the input shape it takes.
 *
 * @module
 */
import {
  BatchNorm2d,
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
  RandomGenerator,
  ReLU,
  Sequential,
} from "../../mod.ts";
import { MNIST_CLASSES, MNIST_PIXELS } from "../data/mnist_sizes.ts";
import type { PlannedBuffer } from "../cli/preflight.ts";

/** Which model `--model` names. */
export type MnistModel = "mlp" | "cnn";

/**
 * The 784-256-256-10 MLP written as `torch.nn.Sequential` is (so its files load strictly into the
 * twin: keys `0.*`, `2.*`, `4.*`); Sequential runs each ReLU in the epilogue of the Linear before
 * it. Linear's init is PyTorch's.
 */
export function mnistMlp(seed: number | RandomGenerator): Sequential {
  const rng = typeof seed === "number" ? new RandomGenerator(seed) : seed;
  return new Sequential(
    new Linear(MNIST_PIXELS, 256, { seed: rng }),
    new ReLU(),
    new Linear(256, 256, { seed: rng }),
    new ReLU(),
    new Linear(256, MNIST_CLASSES, { seed: rng }),
  );
}

/**
 * Conv(1→32, 3×3) → BatchNorm → ReLU → MaxPool 2 → Conv(32→64, 3×3) →
 * BatchNorm → ReLU → MaxPool 2 → Flatten → Linear(1600 → 10): 28 → 26 → 13
 * → 11 → 5. The convolutions have no bias (BatchNorm's shift right after
 * makes it redundant). They run in f16 under AMP; BatchNorm stays fp32.
 */
export function mnistCnn(seed: number | RandomGenerator): Sequential {
  const rng = typeof seed === "number" ? new RandomGenerator(seed) : seed;
  return new Sequential(
    new Conv2d(1, 32, 3, { seed: rng, bias: false }),
    new BatchNorm2d(32),
    new ReLU(),
    new MaxPool2d(2),
    new Conv2d(32, 64, 3, { seed: rng, bias: false }),
    new BatchNorm2d(64),
    new ReLU(),
    new MaxPool2d(2),
    new Flatten(),
    new Linear(64 * 5 * 5, MNIST_CLASSES, { seed: rng }),
  );
}

/** The model `--model` names. */
export function mnistModel(model: MnistModel, seed: number | RandomGenerator): Sequential {
  return model === "cnn" ? mnistCnn(seed) : mnistMlp(seed);
}

/** The shape a batch of `n` images takes: flat pixels for the MLP, [N, 1, 28, 28] for the CNN. */
export function mnistInputShape(model: MnistModel, n: number): number[] {
  return model === "cnn" ? [n, 1, 28, 28] : [n, MNIST_PIXELS];
}

/**
 * The largest buffers a forward and backward pass of `model` allocate for `n`
 * images (sized by `--flag`), in f32 (autocast's f16 copies are smaller): the
 * input, each layer's output (its gradient has the same size; MaxPool's
 * indices and BatchNorm's saved values are no larger) and the widest weight
 * (with its gradient and optimizer state; split-K partial sums of weight
 * gradients stay within a few MB).
 * Keep it in step with {@link mnistMlp} and {@link mnistCnn}:
 * tests/examples/examples_preflight_test.ts checks it is never below the pool's largest request.
 */
export function mnistBuffers(model: MnistModel, n: number, flag: string): PlannedBuffer[] {
  const f32 = (what: string, shape: number[]): PlannedBuffer => ({
    what: `--${flag} ${n}: ${what} f32 [${shape.join(", ")}]`,
    bytes: 4 * shape.reduce((a, b) => a * b, 1),
    grows: [{ flag, value: n, power: 1 }],
  });
  const weight = (shape: number[]): PlannedBuffer => ({
    what: `the widest weight f32 [${shape.join(", ")}]`,
    bytes: 4 * shape.reduce((a, b) => a * b, 1),
    grows: [],
  });
  if (model === "mlp") {
    return [
      weight([256, MNIST_PIXELS]),
      f32("the input", [n, MNIST_PIXELS]),
      f32("a hidden layer", [n, 256]),
      f32("the logits", [n, MNIST_CLASSES]),
    ];
  }
  return [
    weight([MNIST_CLASSES, 64 * 5 * 5]),
    f32("the input", [n, 1, 28, 28]),
    f32("the first convolution's output", [n, 32, 26, 26]),
    f32("the second convolution's output", [n, 64, 11, 11]),
    f32("the logits", [n, MNIST_CLASSES]),
  ];
}
