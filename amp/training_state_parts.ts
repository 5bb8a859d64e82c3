/**
 * What a training-state file holds (the model, its optimizer, the AMP trainer,
 * the schedule), apart from the code that writes it (training_state_file.ts)
 * and the code that reads it (training_state_parse.ts), which both name it.
 *
 * @module
 */
import type { Tensor } from "../gpu/mod.ts";
import type { LoadStateOptions, Module } from "../nn/module.ts";
import type { LrScheduler, OptimizerStateDict } from "../optim/mod.ts";
import type { AmpTrainer } from "./trainer.ts";

/** An optimizer whose state can be saved (`SGD`, `Adam`, `AdamW`). */
export interface SavableOptimizer {
  /** Its parameters, in the order its state dict numbers them. */
  readonly params: readonly Tensor[];
  /** Its state as plain data (a sync point). */
  stateDict(): Promise<OptimizerStateDict>;
  /** Throws unless `state` can be loaded; changes nothing. */
  checkStateDict(state: OptimizerStateDict, options?: LoadStateOptions): void;
  /** Restores it, all or nothing. */
  loadStateDict(state: OptimizerStateDict, options?: LoadStateOptions): void;
}

/** What a training state holds; only `model` is required. */
export interface TrainingStateParts {
  /** The model (with the state of its modules' random generators: Dropout masks). */
  model: Module;
  /** Its optimizer. */
  optimizer?: SavableOptimizer;
  /** The AMP trainer (loss scaler and accumulation counters). */
  trainer?: AmpTrainer;
  /** The learning-rate scheduler (base learning rates and step). */
  scheduler?: LrScheduler;
}
