/**
 * The state of one run of `mnist.ts` (its flags, data, model, trainer and
 * tallies), shared by the program and the files that evaluate, report and
 * resume it.
 *
 * @module
 */
import type {
  Adam,
  AmpTrainer,
  Gpu,
  LrScheduler,
  RandomGenerator,
  Sequential,
  SGD,
} from "../../mod.ts";
import { Tensor } from "../../mod.ts";
import type { PlotPoint } from "../plots/loss_chart.ts";
import type { InspectLog } from "../cli/inspect.ts";
import type { FirstStep } from "../cli/progress.ts";
import type { ProfileWindow } from "../cli/profile_window.ts";
import type { TrainingStep } from "../cli/capture_flag.ts";
import type { SaveLock } from "../runs/save_lock.ts";
import type { MnistSplit } from "../data/mnist.ts";
import type { MnistArgs } from "./args.ts";

/** Prints one event: a JSON line with --json, else `text`. */
export type Emit = (event: string, fields: Record<string, unknown>, text: string) => void;

/** One training run: the flags, the data, the model and what trains it. */
export interface Run {
  cfg: MnistArgs;
  emit: Emit;
  gpu: Gpu;
  train: MnistSplit;
  test: MnistSplit;
  /** Examples per step, and steps per epoch and in all. */
  batch: number;
  stepsPerEpoch: number;
  totalSteps: number;
  model: Sequential;
  optimizer: SGD | Adam;
  trainer: AmpTrainer;
  /** One micro-batch, captured unless --no-capture (or --inspect). */
  step: TrainingStep;
  scheduler: LrScheduler;
  /** Draws each epoch's data order; the saved training state holds its state. */
  shuffler: RandomGenerator;
  /** The steps `--profile` times, if any. */
  profile: ProfileWindow | null;
  /** With --inspect: the numerics inspector on the trainer and its reports so far. */
  inspect: InspectLog | null;
  /** When the program started (performance.now()), for the time to the first accuracy. */
  started: number;
  /** Says the session's first step (it compiles the kernels). */
  firstStep: FirstStep;
  /** --save's lock (told what the file holds after each save), or null. */
  lock: SaveLock | null;
  /** Failed writes of --save so far, and what the file last held (for the run's last word). */
  saves: { failed: number; lastFailed: boolean; holds: string | null };
}

/** What the training loop tracks across epochs, from `step` on. */
export class Tally {
  /** Sum of the losses since the last log, kept on the GPU so logging needs one read. */
  lossSum: Tensor = Tensor.zeros([]);
  lossCount = 0;
  lastLoss = NaN;
  testAccuracy = NaN;
  /** The mean cross-entropy of the last evaluation. */
  testLoss = NaN;
  trainSeconds = 0;
  trainPeak = 0;
  evalPeak = 0;
  /** Bytes allocated after steps 10, 200 and the last (for information). */
  allocatedAfter: Map<number, number> = new Map();
  /** The whole run's chart (a resumed run starts with the points saved before). */
  plotPoints: PlotPoint[];
  /** The step this session started from (0, or where a resumed run stopped). */
  readonly sessionStart: number;
  constructor(public step: number, plotPoints: PlotPoint[] = []) {
    this.sessionStart = step;
    this.plotPoints = plotPoints;
  }
}
