/**
 * `--no-capture`, shared by the training examples: by default their step is
 * captured (`AmpTrainer.capture`: recorded in its first cycles, then
 * replayed with almost no JavaScript), and the flag trains uncaptured
 * (`trainer.step` every time), with the same results bit for bit. A run with
 * a numerics inspector (`--inspect`) trains uncaptured: the inspector watches
 * every op as it is recorded.
 */
import { type AmpTrainer, type CapturedStep, type StepInput, Tensor } from "../../mod.ts";

/** The flag's lines in a help text, the description from column `column`. */
export function captureHelp(column: number): string {
  const pad = (text: string) => text.padEnd(column);
  return [
    `${pad("  --no-capture")}train uncaptured: every step runs its JavaScript (autograd,`,
    `${pad("")}tensors) instead of replaying the step recorded in its first`,
    `${pad("")}steps (the default; same results bit for bit; --inspect`,
    `${pad("")}trains uncaptured)`,
  ].join("\n");
}

/** One training micro-batch on its inputs, captured or not. */
export interface TrainingStep {
  /** Runs a micro-batch on tensors or host data; returns its loss (dispose it). */
  run(...inputs: StepInput[]): Tensor;
  /** The captured step, or null when training uncaptured. */
  readonly captured: CapturedStep | null;
  /** What the final report says of it: whether it was captured, and how often it replayed. */
  stats(): { captured: boolean; replayedSteps: number; captures: number };
}

/**
 * `trainer`'s step on `loss`, captured unless `capture` is false: either way
 * `run(...inputs)` does what `trainer.step(() => loss(...inputs))` does.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AdamW, AmpTrainer, crossEntropy, initGpu, Linear, Tensor } from "../../mod.ts";
 * import { trainingStep } from "./capture_flag.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Linear(2, 2, { seed: 1 });
 * const trainer = new AmpTrainer(model, new AdamW(model.parameters()));
 * const step = trainingStep(trainer, (x, y) => crossEntropy(model.forward(x), y), { capture: false });
 * step.run(Tensor.from([1, 2], [1, 2]), Tensor.from([1], [1], { dtype: "i32" })).dispose();
 * assert.equal(step.captured, null);
 * assert.equal(trainer.steps, 1);
 * gpu.destroy();
 * ```
 */
export function trainingStep(
  trainer: AmpTrainer,
  loss: (...inputs: Tensor[]) => Tensor,
  options: { capture: boolean },
): TrainingStep {
  const captured = options.capture ? trainer.capture(loss) : null;
  return {
    captured,
    run: captured ? (...inputs) => captured.run(...inputs) : (...inputs) => {
      // Uncaptured, host data becomes a tensor for the step (freed after it).
      const made = inputs.map((x) =>
        x instanceof Tensor ? null : Tensor.from(x.data, x.shape, { dtype: x.dtype })
      );
      try {
        return trainer.step(() => loss(...inputs.map((x, i) => made[i] ?? x as Tensor)));
      } finally {
        made.forEach((t) => t?.dispose());
      }
    },
    stats: () => ({
      captured: captured !== null,
      replayedSteps: captured?.stats.replayed ?? 0,
      captures: captured?.stats.captures ?? 0,
    }),
  };
}
