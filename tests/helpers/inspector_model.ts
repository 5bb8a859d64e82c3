/** The small model and batch the numerics inspector tests watch, and a way to break a weight. */
import { Linear, RandomGenerator, ReLU, Sequential, Tensor } from "../../mod.ts";
import { uniform } from "./reference.ts";

/** Input features and classes of {@link mlp}. */
export const FEATURES = 4, CLASSES = 3;

/** Linear "0", ReLU, Linear "2", ReLU, Linear "4" (the ReLUs fuse into the Linears before them). */
export function mlp(seed: number): Sequential {
  const rng = new RandomGenerator(seed);
  return new Sequential(
    new Linear(FEATURES, 8, { seed: rng }),
    new ReLU(),
    new Linear(8, 8, { seed: rng }),
    new ReLU(),
    new Linear(8, CLASSES, { seed: rng }),
  );
}

/** The labels of {@link batch}'s rows. */
export const LABELS = [0, 1, 2, 1, 0, 2];

/** A [6, FEATURES] batch in [-1, 1). */
export const batch = (): Tensor =>
  Tensor.from(uniform(LABELS.length * FEATURES, 7, -1, 1), [LABELS.length, FEATURES]);

/** Overwrites element `index` of `t` (f32) with `value`. */
export async function plant(t: Tensor, index: number, value: number): Promise<void> {
  const values = Float32Array.from(await t.read());
  values[index] = value;
  t.writeBytes(new Uint8Array(values.buffer));
}
