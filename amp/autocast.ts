/**
 * autocast: run ops in f16 (or bf16) or f32 as the policy lists say, like
 * `torch.autocast`. Inside `autocast(fn)`, every op that consults autocast
 * asks the installed hook how to cast its float inputs: ops of the
 * low-precision list (named `f16`: matmul, linear) get inputs in the autocast
 * dtype (an fp32 master weight through its working copy, when `masterWeights`
 * has one), f32-list ops get f32 inputs, and the rest follow the widest input.
 */
import {
  type AutocastOpName,
  cast,
  type CastHook,
  type DType,
  fail,
  getGpu,
  type Gpu,
  markCastForOp,
  type Tensor,
  ValueError,
  warnOnce,
  withState,
} from "../gpu/mod.ts";
import { type AmpDType, ampDType } from "./amp_dtype.ts";
import type { MasterWeights } from "./master_weights.ts";
import { type AutocastLists, DEFAULT_AUTOCAST_LISTS, policyIn } from "./policy.ts";

/** Options of {@link autocast}. */
export interface AutocastOptions {
  /** false runs `fn` with autocast off (a region inside another autocast). Default true. */
  enabled?: boolean;
  /**
   * The dtype the low-precision list runs in: "f16" (default; without
   * shader-f16 autocast runs f32) or "bf16" (PyTorch's `dtype=torch.bfloat16`;
   * needs no shader-f16).
   */
  dtype?: AmpDType;
  /** The op lists (default {@link DEFAULT_AUTOCAST_LISTS}; see `customAutocastLists`). */
  lists?: AutocastLists;
  /**
   * fp32 masters whose working copies low-precision ops read instead of
   * casting the master on every use (`AmpTrainer` passes its own; copies in
   * another dtype than `dtype` are not used).
   */
  masterWeights?: MasterWeights | null;
  /** The device (default: the one `initGpu()` made); without shader-f16, f16 autocast runs f32. */
  gpu?: Gpu;
}

function isFloat(dtype: DType): boolean {
  return dtype !== "i32";
}

/**
 * The dtypes `op`'s inputs take under `lists` with `low` the low-precision
 * dtype: the one decision both halves of the hook use. Promotion of mixed
 * floats (f32 with a half, or f16 with bf16) goes to f32, as in PyTorch.
 */
function policyDtypes(
  lists: AutocastLists,
  low: AmpDType,
  op: AutocastOpName,
  dtypes: readonly DType[],
): DType[] {
  const policy = policyIn(lists, op);
  let want: DType | null = policy === "f16" ? low : policy === "f32" ? "f32" : null;
  if (policy === "promote" && new Set(dtypes.filter(isFloat)).size > 1) want = "f32";
  return dtypes.map((d) => want !== null && isFloat(d) ? want : d);
}

/** Options of {@link autocastHook}. */
export interface AutocastHookOptions {
  /** The dtype of the low-precision list (default "f16"). */
  dtype?: AmpDType;
}

/**
 * The cast hook for `lists`, reading working copies from `masters` where
 * they exist in the hook's dtype.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { autocastHook, DEFAULT_AUTOCAST_LISTS } from "./mod.ts";
 * const hook = autocastHook(DEFAULT_AUTOCAST_LISTS, null, { dtype: "bf16" });
 * assert.equal(hook.dtypes!("matmul", ["f32", "f32"]).join(), "bf16,bf16");
 * assert.equal(hook.dtypes!("add", ["bf16", "f32"]).join(), "f32,f32");
 * ```
 */
export function autocastHook(
  lists: AutocastLists,
  masters: MasterWeights | null = null,
  options: AutocastHookOptions = {},
): CastHook {
  const low = ampDType("autocastHook", options.dtype);
  const castTo = (t: Tensor, dtype: DType) => {
    if (t.dtype === dtype) return t;
    if (dtype === low) {
      return masters?.readWorkingCopy(t, low) ?? markCastForOp(cast(t, low));
    }
    return markCastForOp(cast(t, dtype));
  };
  const dtypes = (op: AutocastOpName, given: readonly DType[]) =>
    policyDtypes(lists, low, op, given);
  const hook = (op: AutocastOpName, inputs: readonly Tensor[]) => {
    const want = dtypes(op, inputs.map((t) => t.dtype));
    return inputs.map((t, i) => castTo(t, want[i]));
  };
  return Object.assign(hook, { dtypes });
}

/**
 * Runs `fn` with automatic mixed precision. Synchronous, like `tidy`.
 * Without shader-f16 on the adapter f16 autocast runs `fn` in f32 and says
 * so once; `{ dtype: "bf16" }` runs anywhere (it needs no shader-f16).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { autocast, crossEntropy, initGpu, Linear, Tensor, tidy } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Linear(4, 3, { seed: 1 });
 * const x = Tensor.from([1, 2, 3, 4, 4, 3, 2, 1], [2, 4]), labels = [2, 0];
 * const logits = autocast(() => model.forward(x));
 * assert.equal(logits.dtype, gpu.f16 ? "f16" : "f32"); // the matmul ran in f16
 * const loss = tidy(() => autocast(() => crossEntropy(model.forward(x), labels)));
 * assert.equal(loss.dtype, "f32"); // losses are f32
 * const bf16 = autocast(() => model.forward(x), { dtype: "bf16" });
 * assert.equal(bf16.dtype, "bf16"); // bf16 needs no shader-f16
 * gpu.destroy();
 * ```
 */
export function autocast<T>(fn: () => T, options: AutocastOptions = {}): T {
  let hook: CastHook | null = null;
  const dtype = ampDType("autocast", options.dtype);
  if (options.enabled ?? true) {
    const gpu = options.gpu ?? getGpu();
    if (gpu.f16 || dtype === "bf16") {
      hook = autocastHook(options.lists ?? DEFAULT_AUTOCAST_LISTS, options.masterWeights ?? null, {
        dtype,
      });
    } else {
      warnOnce(
        'autocast: the adapter has no shader-f16; running in f32 (dtype "bf16" needs none).',
      );
    }
  }
  return withState({ castHook: hook }, () => {
    const result = fn();
    if (result instanceof Promise) {
      fail(ValueError, "autocast", "fn returned a Promise; autocast regions must be synchronous.");
    }
    return result;
  });
}
