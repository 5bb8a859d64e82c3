/**
 * Automatic mixed precision: the autocast policy as data (f16, f32 and
 * promote op lists; custom allow/deny lists), `autocast()`, fp32 master
 * weights with f16 working copies, dynamic and static loss scaling
 * (`GradScaler`, decided on the GPU), clipping by global norm on the GPU,
 * the optimizer interface, and `AmpTrainer`, which runs the whole step.
 *
 * @module
 */
export {
  type AutocastLists,
  type CastPolicy,
  castPolicyOf,
  customAutocastLists,
  type CustomListsOptions,
  DEFAULT_AUTOCAST_LISTS,
} from "./policy.ts";
export { autocast, autocastHook, type AutocastOptions, withCastHook } from "./autocast.ts";
export { MasterWeights, readWorkingCopy, workingCopyOf } from "./master_weights.ts";
export { clipGradNorm, type ClipResult } from "./clip.ts";
export type { AmpOptimizer, StepSignals } from "./optimizer.ts";
export {
  type AdamGroup,
  type AdamParamGroup,
  AdamW,
  FusedAdam,
  type FusedAdamOptions,
  FusedSGD,
  type FusedSGDOptions,
  type Group,
  type OptimizerStateDict,
  type ParamGroup,
  type SGDGroup,
  type SGDParamGroup,
} from "./optimizers.ts";
export {
  cosineSchedule,
  type CosineScheduleOptions,
  linearWarmupDecay,
  type LinearWarmupDecayOptions,
  type LrGroups,
  type LrSchedule,
  LrScheduler,
} from "./lr_schedule.ts";
export { GradScaler, type GradScalerOptions, type GradScalerState } from "./grad_scaler.ts";
export {
  AmpTrainer,
  type AmpTrainerOptions,
  type AmpTrainerState,
  type HasParameters,
} from "./trainer.ts";
