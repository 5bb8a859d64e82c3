/**
 * The state of one run of `tiny_gpt.ts` and what its training measured,
 * shared by the program and its report.
 *
 * @module
 */
import type { AdamW, AmpTrainer, Gpu } from "../../mod.ts";
import type { Gpt } from "../../models/mod.ts";
import type { PlotPoint } from "../plots/loss_chart.ts";
import type { InspectLog } from "../cli/inspect.ts";
import type { ProfileWindow } from "../cli/profile_window.ts";
import type { TrainingStep } from "../cli/capture_flag.ts";
import type { evaluationWindows, WordCorpus } from "../data/words.ts";
import type { TinyGptArgs } from "./args.ts";

/** Prints one event: a JSON line with --json, else `text`. */
export type Emit = (event: string, fields: Record<string, unknown>, text: string) => void;

/** Validation windows: inputs and targets, [count, context] each. */
export type Windows = ReturnType<typeof evaluationWindows>;

/** One training run: the flags, the data, the model and what trains it. */
export interface Run {
  cfg: TinyGptArgs;
  emit: Emit;
  gpu: Gpu;
  corpus: WordCorpus;
  windows: Windows;
  /** The bigram baseline's loss on the validation windows. */
  bigram: number;
  model: Gpt;
  optimizer: AdamW;
  trainer: AmpTrainer;
  /** One micro-batch, captured unless --no-capture (or --inspect). */
  step: TrainingStep;
  /** The steps `--profile` times, if any. */
  profile: ProfileWindow | null;
  /** With --inspect: the numerics inspector on the trainer and its reports so far. */
  inspect?: InspectLog | null;
}

/** What training measured. */
export interface Training {
  lastLoss: number;
  trainSeconds: number;
  trainPeak: number;
  plotPoints: PlotPoint[];
}
