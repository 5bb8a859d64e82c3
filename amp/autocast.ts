/**
 * autocast: run ops in f16 or f32 as the policy lists say, like
 * `torch.autocast`. Inside `autocast(fn)`, every op that consults autocast
 * asks the installed hook how to cast its float inputs: f16-list ops
 * (matmul, linear) get f16 inputs (an fp32 master weight through its working
 * copy, when `masterWeights` has one), f32-list ops get f32 inputs, and the
 * rest follow the widest input.
 */
import { type CastHook, markCastForOp } from "../gpu/autocast_hook.ts";
import { getGpu, type Gpu } from "../gpu/device.ts";
import type { DType } from "../gpu/dtype.ts";
import type { AutocastOpName } from "../gpu/op_registry.ts";
import { cast } from "../gpu/ops/elementwise.ts";
import { warnOnce, withState } from "../gpu/runtime_state.ts";
import type { Tensor } from "../gpu/tensor.ts";
import { fail, ValueError } from "../gpu/errors.ts";
import type { MasterWeights } from "./master_weights.ts";
import { type AutocastLists, DEFAULT_AUTOCAST_LISTS, policyIn } from "./policy.ts";

/** Options of {@link autocast}. */
export interface AutocastOptions {
  /** false runs `fn` with autocast off (a region inside another autocast). Default true. */
  enabled?: boolean;
  /** The op lists (default {@link DEFAULT_AUTOCAST_LISTS}; see `customAutocastLists`). */
  lists?: AutocastLists;
  /**
   * fp32 masters whose f16 working copies f16 ops read instead of casting
   * the master on every use (`AmpTrainer` passes its own).
   */
  masterWeights?: MasterWeights | null;
  /** The device (default: the one `initGpu()` made); without shader-f16 autocast runs f32. */
  gpu?: Gpu;
}

function isFloat(dtype: DType): boolean {
  return dtype === "f32" || dtype === "f16";
}

/** The dtypes `op`'s inputs take under `lists`: the one decision both halves of the hook use. */
function policyDtypes(lists: AutocastLists, op: AutocastOpName, dtypes: readonly DType[]): DType[] {
  const policy = policyIn(lists, op);
  let want: DType | null = policy === "f16" || policy === "f32" ? policy : null;
  if (policy === "promote") {
    const floats = dtypes.filter(isFloat);
    if (floats.includes("f32") && floats.includes("f16")) want = "f32";
  }
  return dtypes.map((d) => want !== null && isFloat(d) ? want : d);
}

/** The cast hook for `lists`, reading working copies from `masters` where they exist. */
export function autocastHook(lists: AutocastLists, masters: MasterWeights | null = null): CastHook {
  const castTo = (t: Tensor, dtype: DType) => {
    if (t.dtype === dtype) return t;
    if (dtype === "f16") return masters?.readWorkingCopy(t) ?? markCastForOp(cast(t, "f16"));
    return markCastForOp(cast(t, dtype));
  };
  const dtypes = (op: AutocastOpName, given: readonly DType[]) => policyDtypes(lists, op, given);
  const hook = (op: AutocastOpName, inputs: readonly Tensor[]) => {
    const want = dtypes(op, inputs.map((t) => t.dtype));
    return inputs.map((t, i) => castTo(t, want[i]));
  };
  return Object.assign(hook, { dtypes });
}

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
    if (gpu.f16) {
      hook = autocastHook(options.lists ?? DEFAULT_AUTOCAST_LISTS, options.masterWeights ?? null);
    } else warnOnce("autocast: the adapter has no shader-f16; running in f32.");
  }
  return withState({ castHook: hook }, () => {
    const result = fn();
    if (result instanceof Promise) {
      fail(ValueError, "autocast", "fn returned a Promise; autocast regions must be synchronous.");
    }
    return result;
  });
}
