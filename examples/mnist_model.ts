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
} from "../mod.ts";
import { MNIST_CLASSES, MNIST_PIXELS } from "./mnist_data.ts";

/** Which model `--model` names. */
export type MnistModel = "mlp" | "cnn";

/** The 784-256-256-10 MLP; ReLU fused into the first two matmuls. Linear's init is PyTorch's. */
export function mnistMlp(seed: number | RandomGenerator): Sequential {
  const rng = typeof seed === "number" ? new RandomGenerator(seed) : seed;
  return new Sequential(
    new Linear(MNIST_PIXELS, 256, { seed: rng, activation: "relu" }),
    new Linear(256, 256, { seed: rng, activation: "relu" }),
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
