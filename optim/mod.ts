/**
 * Optimizers and what surrounds them: `SGD`, `Adam` and `AdamW` as one fused
 * kernel over up to 16 parameters per dispatch (fp32 masters and state, f16 working copies written
 * in the same kernel, a GPU-side skip when a step overflowed), parameter
 * groups and state dicts, learning-rate schedules, and clipping by global
 * norm on the GPU. Nothing here knows about loss scaling: amp's `GradScaler`
 * drives any {@link Optimizer} through its step signals.
 *
 * @module
 */
export type { Optimizer, StepSignals, WorkingCopies } from "./optimizer.ts";
export type { Group, ParamGroup } from "./_fused_optimizer.ts";
export type { HyperValue, OptimizerStateDict, StateBuffer } from "./_optimizer_state.ts";
export { SGD, type SGDGroup, type SGDOptions, type SGDParamGroup } from "./sgd.ts";
export {
  Adam,
  type AdamGroup,
  type AdamOptions,
  type AdamParamGroup,
  AdamW,
  type StateDtype,
} from "./adam.ts";
export { clipGradNorm, type ClipOptions, type ClipResult } from "./clip.ts";
export { dequantizeStates } from "./dequantize_states.ts";
export {
  cosineSchedule,
  type CosineScheduleOptions,
  linearWarmupDecay,
  type LinearWarmupDecayOptions,
  type LrGroups,
  type LrSchedule,
  type LrScheduleDescription,
  LrScheduler,
  type LrSchedulerState,
} from "./lr_schedule.ts";
