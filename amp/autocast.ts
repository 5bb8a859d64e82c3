/**
 * autocast: run ops in f16 or f32 as the policy lists say, like
 * `torch.autocast`. Inside `autocast(fn)`, every op asks the installed hook
 * how to cast its float inputs: f16-list ops (matmul, linear) get f16 inputs
 * (weights through their fp32 masters' working copies), f32-list ops get f32
 * inputs, and the rest follow the widest input.
 */
import { type CastHook, setCastHook } from "../gpu/autocast_hook.ts";
import { getGpu, type Gpu } from "../gpu/device.ts";
import { cast } from "../gpu/ops/elementwise.ts";
import type { Tensor } from "../gpu/tensor.ts";
import { readWorkingCopy } from "./master_weights.ts";
import { type AutocastLists, castPolicyOf, DEFAULT_AUTOCAST_LISTS } from "./policy.ts";

/** Options of {@link autocast}. */
export interface AutocastOptions {
  /** false runs `fn` with autocast off (a region inside another autocast). Default true. */
  enabled?: boolean;
  /** The op lists (default {@link DEFAULT_AUTOCAST_LISTS}; see `customAutocastLists`). */
  lists?: AutocastLists;
  /** The device (default: the one `initGpu()` made); without shader-f16 autocast runs f32. */
  gpu?: Gpu;
}

function isFloat(t: Tensor): boolean {
  return t.dtype === "f32" || t.dtype === "f16";
}

function toF16(t: Tensor): Tensor {
  if (t.dtype !== "f32") return t;
  return readWorkingCopy(t) ?? cast(t, "f16");
}

function toF32(t: Tensor): Tensor {
  return t.dtype === "f16" ? cast(t, "f32") : t;
}

/** The cast hook for `lists`. */
export function autocastHook(lists: AutocastLists): CastHook {
  return (op, inputs) => {
    const policy = castPolicyOf(op, lists);
    if (policy === "f16") return inputs.map(toF16);
    if (policy === "f32") return inputs.map(toF32);
    const floats = inputs.filter(isFloat);
    const mixed = floats.some((t) => t.dtype === "f32") && floats.some((t) => t.dtype === "f16");
    return mixed ? inputs.map(toF32) : [...inputs];
  };
}

const warned = new WeakSet<Gpu>();

/**
 * Runs `fn` with automatic mixed precision. Synchronous, like `tidy`.
 * Without shader-f16 on the adapter it runs `fn` in f32 and says so once.
 *
 * @example
 * ```ts
 * import { autocast, crossEntropy, initGpu, Linear, Tensor, tidy } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Linear(4, 3, { seed: 1 });
 * const x = Tensor.from([1, 2, 3, 4, 4, 3, 2, 1], [2, 4]), labels = [2, 0];
 * const logits = autocast(() => model.forward(x));
 * console.assert(logits.dtype === (gpu.f16 ? "f16" : "f32")); // the matmul ran in f16
 * const loss = tidy(() => autocast(() => crossEntropy(model.forward(x), labels)));
 * console.assert(loss.dtype === "f32"); // losses are f32
 * gpu.destroy();
 * ```
 */
export function autocast<T>(fn: () => T, options: AutocastOptions = {}): T {
  let hook: CastHook | null = null;
  if (options.enabled ?? true) {
    const gpu = options.gpu ?? getGpu();
    if (gpu.f16) hook = autocastHook(options.lists ?? DEFAULT_AUTOCAST_LISTS);
    else if (!warned.has(gpu)) {
      warned.add(gpu);
      console.warn("[halfstep] autocast: the adapter has no shader-f16; running in f32.");
    }
  }
  return withCastHook(hook, fn);
}

/** Runs `fn` with `hook` (null: autocast off) in force, restoring the previous state after. */
export function withCastHook<T>(hook: CastHook | null, fn: () => T): T {
  const previous = setCastHook(hook);
  try {
    const result = fn();
    if (result instanceof Promise) {
      throw new TypeError("autocast: fn returned a Promise; autocast regions must be synchronous.");
    }
    return result;
  } finally {
    setCastHook(previous);
  }
}
