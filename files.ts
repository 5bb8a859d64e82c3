/**
 * File access for models and training runs, with Deno's file APIs (the rest
 * of halfstep uses Web APIs only, so `mod.ts` loads from any URL and in
 * browsers): safetensors files, whole modules, and training states (model,
 * optimizer and AMP state) that resume a run exactly. Every write is atomic,
 * refuses NaN / ±Inf values unless `{ allowNonFinite: true }` (a diverged run
 * never replaces a good file), and stores checksums that every load verifies.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Linear } from "./mod.ts";
 * import { loadModule, saveModule } from "./files.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const dir = await Deno.makeTempDir(), path = `${dir}/linear.safetensors`;
 * const original = new Linear(4, 2, { seed: 1 });
 * await saveModule(path, original);
 * const copy = new Linear(4, 2, { seed: 2 });
 * await loadModule(path, copy); // names, shapes and dtypes are checked first
 * assert.deepEqual(await copy.weight.read(), await original.weight.read());
 * await Deno.remove(dir, { recursive: true });
 * gpu.destroy();
 * ```
 *
 * @module
 */
export {
  linkTarget,
  loadModule,
  loadSafetensors,
  saveModule,
  type SaveOptions,
  saveSafetensors,
} from "./nn/safetensors_file.ts";
export {
  loadTrainingState,
  type SavableOptimizer,
  saveTrainingState,
  type SaveTrainingStateOptions,
  type TrainingStateParts,
} from "./amp/training_state_file.ts";
