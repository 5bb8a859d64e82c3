/**
 * Automatic mixed precision, the top of the library: the autocast policy as
 * data (f16, f32 and promote op lists from the op registry; custom allow and
 * deny lists), `autocast()`, fp32 master weights with f16 working copies,
 * dynamic and static loss scaling decided on the GPU (`GradScaler`, which
 * drives any optimizer), and `AmpTrainer`, which runs the whole step: autocast
 * forward, scaled backward, accumulation, unscale, clipping, the optimizer
 * step and the scale update. Saving a whole training run lives in `files.ts`.
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
export {
  autocast,
  autocastHook,
  type AutocastHookOptions,
  type AutocastOptions,
} from "./autocast.ts";
export { AMP_DTYPES, type AmpDType } from "./amp_dtype.ts";
export { MasterWeights, type MasterWeightsOptions } from "./master_weights.ts";
export {
  GradScaler,
  type GradScalerOptions,
  type GradScalerState,
  isStaticLossScale,
} from "./grad_scaler.ts";
export {
  AmpTrainer,
  type AmpTrainerOptions,
  type AmpTrainerState,
  type GradDType,
  type HasParameters,
  type TrainerPrecision,
} from "./trainer.ts";
export {
  CapturedStep,
  type CaptureOptions,
  type CaptureStats,
  type HostInput,
  type StepInput,
} from "./captured_step.ts";
export { NumericsInspector, type ReportOptions, type WatchOptions } from "./numerics_inspector.ts";
export {
  type FirstNonFinite,
  type NumericsCounts,
  type NumericsPhase,
  type NumericsReport,
  type NumericsRow,
  type OpDtypeCount,
  type ParameterGradientRow,
} from "./numerics_report.ts";
export {
  compareToF32,
  type CompareToF32Options,
  type Drift,
  type DriftReport,
  type OpDrift,
  type ParameterDrift,
} from "./compare_to_f32.ts";
