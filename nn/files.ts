/**
 * File access for models and training runs (Deno file APIs; the rest of
 * halfstep uses Web APIs only): safetensors files, whole modules, and
 * training checkpoints (model + optimizer + AMP state) that resume exactly.
 *
 * @module
 */
export { loadModule, loadSafetensors, saveModule, saveSafetensors } from "./safetensors_file.ts";
export {
  type CheckpointParts,
  loadCheckpoint,
  type SavableOptimizer,
  saveCheckpoint,
} from "./checkpoint_file.ts";
