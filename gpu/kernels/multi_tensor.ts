/**
 * Multi-tensor dispatches (apex's `multi_tensor_apply`, PyTorch's `_foreach`
 * kernels): one dispatch runs a per-element kernel over several tensors, so
 * the once-per-parameter work of a training step (unscale, gradient norm,
 * optimizer update) costs a few dispatches instead of a few per parameter.
 * Every dispatch has a fixed cost on the GPU and in JavaScript, and a model
 * has tens to hundreds of parameters.
 *
 * WGSL cannot index bindings at run time, so a kernel of `slots` tensors
 * declares each of its per-tensor bindings once per slot (`grad0`, `grad1`,
 * ...) and repeats its body per slot inside a `switch`. Each tensor gets
 * its own run of workgroups, the same workgroups it would get alone, so
 * results are the same bits as one dispatch per tensor; a workgroup finds
 * its tensor in the slot table of the uniforms (`p.wg0` ≤ … of the first
 * workgroup of each slot, `p.n0`, … the element counts).
 */
import type { Gpu } from "../device/gpu.ts";
import type { Binding, UniformFields } from "../device/kernel.ts";
import type { DeviceArray } from "../device/device_array.ts";
import { grid1d, WGSL_WORKGROUP_INDEX } from "./wgsl/grid.ts";
import { defineTunerSettings, type TunerSettings } from "../tuning/settings.ts";

/** The most tensors one dispatch takes (the slot table fills 2·16 + 1 uniform words). */
export const MAX_TENSOR_SLOTS = 16;

/** The multi-tensor kernels' tuning settings on one device (see {@link multiTensorSettings}). */
export interface MultiTensorSettings {
  /**
   * The most tensors one dispatch of the once-per-parameter kernels
   * (GradScaler unscale, gradient-norm clipping, optimizer updates) takes;
   * the storage-buffer limit may allow fewer. Results are the same bits either way.
   */
  slots: number;
}

/**
 * The multi-tensor kernels' settings of a device (`multiTensorSettings.of(gpu).slots`).
 * Default {@link MAX_TENSOR_SLOTS} on GPUs and 1 (one dispatch per tensor)
 * on CPU adapters, where the slot switch costs more per element than the
 * dispatches it saves.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, multiTensorSettings } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.equal(multiTensorSettings.of(gpu).slots, gpu.adapterProfile.cpu ? 1 : 16);
 * gpu.destroy();
 * ```
 */
export const multiTensorSettings: TunerSettings<MultiTensorSettings> = defineTunerSettings(
  "multi-tensor",
  (gpu) => ({ slots: gpu.adapterProfile.cpu ? 1 : MAX_TENSOR_SLOTS }),
);

/** A field of the slot table: `wg<k>` (first workgroup of slot k) or `n<k>` (its element count). */
export type SlotField = `wg${number}` | `n${number}`;

/** The slot table's field names, made once (a table is filled at every dispatch). */
const WG_FIELDS = Array.from({ length: MAX_TENSOR_SLOTS + 1 }, (_, k) => `wg${k}` as SlotField);
const N_FIELDS = Array.from({ length: MAX_TENSOR_SLOTS }, (_, k) => `n${k}` as SlotField);

/** The uniform fields of the slot table, for a kernel's `uniforms`. */
export const SLOT_UNIFORMS: UniformFields<SlotField> = Object.fromEntries([
  ...Array.from({ length: MAX_TENSOR_SLOTS + 1 }, (_, k) => [`wg${k}`, "u32"]),
  ...Array.from({ length: MAX_TENSOR_SLOTS }, (_, k) => [`n${k}`, "u32"]),
]);

/** `bindings` once per slot, each name suffixed with its slot (`grad` → `grad0`, `grad1`, ...). */
export function slotBindings(slots: number, bindings: readonly Binding[]): Binding[] {
  return Array.from({ length: slots }, (_, k) => bindings.map((b) => ({ ...b, name: b.name + k })))
    .flat();
}

/**
 * WGSL that runs `body(k)` for the workgroup's slot k, with `wg` (the
 * workgroup's index within its tensor) and `n` (the tensor's element count)
 * in scope; `all_wg` is the workgroup's index in the whole dispatch. Needs
 * the grid builtins of `grid.ts`. The slot is uniform across a workgroup, so
 * bodies may use barriers.
 */
export function wgslForEachSlot(slots: number, body: (k: number) => string): string {
  const cases = Array.from({ length: slots }, (_, k) =>
    `    case ${k}u: {
      let wg = all_wg - p.wg${k};
      let n = p.n${k};
      ${body(k)}
    }`).join("\n");
  // Workgroups past the last tensor's (a grid spilled into y rounds up) find
  // slot `slots`, which runs the empty default case.
  const find = Array.from(
    { length: slots },
    (_, k) => `  if (all_wg >= p.wg${k + 1}) { slot = ${k + 1}u; }`,
  ).join("\n");
  return `let all_wg = ${WGSL_WORKGROUP_INDEX};
  var slot = 0u;
${find}
  switch slot {
${cases}
    default: {}
  }`;
}

/**
 * How many tensors one dispatch of a kernel may take: at most
 * {@link MAX_TENSOR_SLOTS} and the device's `multiTensorSettings`, and as many as the
 * device's storage-buffer limit leaves room for, given `perTensor` storage
 * bindings per tensor and `shared` others (at least one).
 */
export function slotsPerDispatch(gpu: Gpu, perTensor: number, shared: number): number {
  const room = Math.floor(
    (gpu.adapterProfile.limits.maxStorageBuffersPerShaderStage - shared) / perTensor,
  );
  return Math.max(1, Math.min(MAX_TENSOR_SLOTS, multiTensorSettings.of(gpu).slots, room));
}

/**
 * Splits `items` into runs of at most `size` consecutive items that agree on
 * `key` (items with different kernel configs cannot share a dispatch).
 */
export function multiTensorChunks<T>(
  items: readonly T[],
  size: number,
  key: (t: T) => string,
): T[][] {
  const chunks: T[][] = [];
  let last: string | undefined;
  for (const item of items) {
    const k = key(item);
    const open = chunks.at(-1);
    if (open && k === last && open.length < size) open.push(item);
    else chunks.push([item]);
    last = k;
  }
  return chunks;
}

/**
 * The slot table and grid of one dispatch over tensors of `sizes` elements
 * that take `workgroups` workgroups each.
 */
export function slotTable(
  sizes: readonly number[],
  workgroups: readonly number[],
): { uniforms: Record<SlotField, number>; grid: [number, number]; workgroups: number } {
  const uniforms = {} as Record<SlotField, number>;
  let total = 0;
  for (let k = 0; k < MAX_TENSOR_SLOTS; k++) {
    uniforms[WG_FIELDS[k]] = total;
    uniforms[N_FIELDS[k]] = sizes[k] ?? 0;
    total += workgroups[k] ?? 0;
  }
  uniforms[WG_FIELDS[MAX_TENSOR_SLOTS]] = total;
  return { uniforms, grid: grid1d(total), workgroups: total };
}

/** The slot table and grid of one dispatch (see {@link slotTable}). */
export type SlotTable = ReturnType<typeof slotTable>;

/** How a list of items is split into multi-tensor dispatches (see {@link multiTensorDispatches}). */
export interface MultiTensorPlan<T> {
  /** Storage bindings each item takes. */
  perTensor: number;
  /** Storage bindings every dispatch has besides (at least one). */
  shared: number;
  /** Items share a dispatch only when this agrees (their kernel config). */
  key(item: T): string;
  /** The item's element count (its slot's `n`). */
  size(item: T): number;
  /** The workgroups the item takes. */
  workgroups(item: T): number;
}

/**
 * The dispatches that cover `items` on `gpu`: runs of consecutive items that
 * share a kernel config and fit {@link slotsPerDispatch}, each with its slot
 * table. The caller dispatches each run with `slots: chunk.length`.
 */
export function multiTensorDispatches<T>(
  gpu: Gpu,
  items: readonly T[],
  plan: MultiTensorPlan<T>,
): { chunk: T[]; table: SlotTable }[] {
  const slots = slotsPerDispatch(gpu, plan.perTensor, plan.shared);
  return multiTensorChunks(items, slots, plan.key).map((chunk) => ({
    chunk,
    table: slotTable(chunk.map(plan.size), chunk.map(plan.workgroups)),
  }));
}

/** `{ name0: tensors[0], name1: tensors[1], ... }`: the buffers of one per-tensor binding. */
export function slotBuffers(
  name: string,
  tensors: readonly DeviceArray[],
): Record<string, DeviceArray> {
  let names = SLOT_NAMES.get(name);
  if (!names) SLOT_NAMES.set(name, names = WG_FIELDS.map((_, k) => name + k));
  const out: Record<string, DeviceArray> = {};
  for (let k = 0; k < tensors.length; k++) out[names[k]] = tensors[k];
  return out;
}

/** `grad0`, `grad1`, ... by per-tensor binding name, made once each. */
const SLOT_NAMES = new Map<string, string[]>();
