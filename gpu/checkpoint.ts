/**
 * Gradient checkpointing (Chen et al. 2016): run a region without keeping
 * its intermediate activations, and recompute them during backward. Only the
 * region's inputs are saved. The recompute re-enters the autocast state of
 * the first run, replays the same random numbers (dropout masks), and tells
 * BatchNorm not to update its running statistics a second time.
 */
import { backward, enableGrad, noGrad, record } from "./autograd.ts";
import { currentCastHook, setCastHook } from "./autocast_hook.ts";
import { GpuError } from "./device.ts";
import { RandomTape } from "./random.ts";
import { sameShape } from "./shape.ts";
import { keep, tidy, tracked, untracked } from "./scope.ts";
import type { Tensor } from "./tensor.ts";

let recomputing = 0;

/** True while a checkpointed region is being recomputed (BatchNorm then leaves its statistics alone). */
export function isRecomputing(): boolean {
  return recomputing > 0;
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
 * import { checkpoint, initGpu, relu, scale, sum, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const input = Tensor.from([-1, 2], [2], { requiresGrad: true });
 * const h = checkpoint((x) => scale(relu(x), 3), input); // relu(x) is not kept
 * sum(h).backward(); // runs the region again, then backpropagates through it
 * console.assert((await input.grad!.read()).join() === "0,3");
 * gpu.destroy();
 * ```
 */
export function checkpoint(fn: (...inputs: Tensor[]) => Tensor, ...inputs: Tensor[]): Tensor {
  const hook = currentCastHook();
  const randomness = new RandomTape();
  // First run: no tape, and every intermediate freed as soon as fn returns.
  const output = randomness.record(() => tidy(() => noGrad(() => fn(...inputs))));
  const shape = output.shape, dtype = output.dtype;
  return record(
    "checkpoint",
    inputs,
    output,
    (g, saved) => {
      // Fresh leaves that share the saved inputs' memory collect their gradients.
      const leaves = untracked(() =>
        saved.map((t, i) => {
          const leaf = t.share();
          leaf.requiresGrad = inputs[i].requiresGrad;
          return leaf;
        })
      );
      const previousHook = setCastHook(hook);
      recomputing++;
      try {
        // Backward rules run untracked; the recompute needs its tidy scope back
        // so its intermediates go as soon as the tape has used them.
        const again = tracked(() =>
          keep(randomness.replay(() => tidy(() => enableGrad(() => fn(...leaves)))))
        );
        if (again.dtype !== dtype || !sameShape(again.shape, shape)) {
          const first = `${dtype} [${shape.join(", ")}]`;
          again.dispose();
          throw new GpuError(
            `checkpoint: the recomputed output is ${again.describe()} but the first run gave ${first}; ` +
              "a checkpointed function must compute the same thing every time it runs.",
          );
        }
        if (again.gradFn) backward(again, { gradient: g });
        again.dispose();
        return leaves.map((leaf) => leaf.grad);
      } finally {
        recomputing--;
        setCastHook(previousHook);
        for (const leaf of leaves) leaf.dispose(); // their .grad handles live on
      }
    },
    inputs,
    { always: true },
  ); // parameters inside fn may need gradients even if no input does
}
