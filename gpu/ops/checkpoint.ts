/**
 * Gradient checkpointing (Chen et al. 2016): run a region without keeping
 * its intermediate activations, and recompute them during backward. Only the
 * region's inputs are saved. The recompute runs under the runtime modes of
 * the first run (the same autocast hook), replays the same random numbers
 * (dropout masks), and is flagged as a recompute so BatchNorm does not update
 * its running statistics a second time.
 */
import { backward, noGrad, record } from "../tensor/autograd.ts";
import { fail, StateError, ValueError } from "../base/errors.ts";
import { assertTensors } from "./checks.ts";
import { shortValue } from "../base/short_text.ts";
import { RandomTape } from "../tensor/random.ts";
import { currentModes, runtime, withState } from "../tensor/runtime_state.ts";
import { keep, tidy, untracked } from "../tensor/scope.ts";
import { sameShape } from "../base/shape.ts";
import type { Tensor } from "../tensor/tensor.ts";

/** True while a checkpointed region is being recomputed (BatchNorm then leaves its statistics alone). */
export function isRecomputing(): boolean {
  return runtime.recomputing;
}

/**
 * Runs `fn(...inputs)` keeping none of its intermediate activations: during
 * backward it runs `fn` again, on the tape, and backpropagates through it.
 * Gradients, dropout masks and BatchNorm statistics come out exactly as
 * without checkpointing; the price is one more forward pass of the region.
 * `fn` must be deterministic in its tensor inputs and return one tensor.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkpoint, initGpu, relu, scale, sum, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const input = Tensor.from([-1, 2], [2], { requiresGrad: true });
 * const h = checkpoint((x) => scale(relu(x), 3), input); // relu(x) is not kept
 * sum(h).backward(); // runs the region again, then backpropagates through it
 * assert.equal((await input.grad!.read()).join(), "0,3");
 * gpu.destroy();
 * ```
 */
export function checkpoint(fn: (...inputs: Tensor[]) => Tensor, ...inputs: Tensor[]): Tensor {
  if (typeof fn !== "function") {
    fail(
      ValueError,
      "checkpoint",
      `the first argument must be the function to recompute, got ${shortValue(fn)}; ` +
        "call checkpoint((x) => ..., x).",
    );
  }
  assertTensors("checkpoint", ...inputs);
  const firstRun = currentModes();
  const randomness = new RandomTape();
  // First run: no tape, and every intermediate freed as soon as fn returns.
  const output = withState(
    { randomTape: randomness },
    () => tidy(() => noGrad(() => fn(...inputs))),
  );
  const shape = output.shape, dtype = output.dtype;
  return record({
    op: "checkpoint",
    inputs,
    output,
    save: inputs,
    // Parameters inside fn may need gradients even if no input does.
    always: true,
    backward: (g, saved) => {
      // Fresh leaves that share the saved inputs' memory collect their gradients.
      const leaves = untracked(() =>
        saved.map((t, i) => {
          const leaf = t.share();
          leaf.requiresGrad = inputs[i].requiresGrad;
          return leaf;
        })
      );
      // The first run's modes (autocast hook included), on the tape, tracked by a
      // tidy scope of its own so intermediates go as soon as the tape has used them.
      const recompute = {
        ...firstRun,
        gradEnabled: true,
        recomputing: true,
        tracking: true,
        randomTape: randomness.startReplay(),
      };
      try {
        const again = withState(recompute, () => keep(tidy(() => fn(...leaves))));
        if (again.dtype !== dtype || !sameShape(again.shape, shape)) {
          const first = `${dtype} [${shape.join(", ")}]`;
          again.dispose();
          fail(
            StateError,
            "checkpoint",
            `the recomputed output is ${again.describe()} but the first run gave ${first}; ` +
              "a checkpointed function must compute the same thing every time it runs.",
          );
        }
        if (again.gradFn) backward(again, { gradient: g });
        again.dispose();
        return leaves.map((leaf) => leaf.grad);
      } finally {
        for (const leaf of leaves) leaf.dispose(); // their .grad handles live on
      }
    },
  });
}
