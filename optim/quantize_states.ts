/**
 * f32 Adam moments (a run PyTorch continued and wrote back, or one trained
 * with f32 states) in the compact form an optimizer with `stateDtype`
 * "8bit" or "bf16" keeps: the inverse of `dequantizeStates`, on the CPU, as
 * the update kernel quantizes (blockwise absmax, nearest code; bf16 rounded
 * to nearest even, since a load draws no random numbers).
 * @internal
 */
import type { OptimizerStateDict, StateBuffer, StateSpec } from "./_optimizer_state.ts";
import { bf16FromF32 } from "../gpu/mod.ts";
import { dynamicCode } from "./_dynamic_code.ts";
import { STATE_BLOCK } from "./kernels/compact_update.ts";

/** The index of the code nearest to `x` in the sorted `map` (ties to the lower index). */
function nearestCode(map: Float32Array, x: number): number {
  let lo = 0, hi = 255;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (map[mid] <= x) lo = mid;
    else hi = mid;
  }
  return Math.abs(map[hi] - x) < Math.abs(x - map[lo]) ? hi : lo;
}

/** `values` as 8-bit codes of `map` and one absmax per block. */
function quantize8bit(values: Float32Array, map: Float32Array): [Uint8Array, Float32Array] {
  const blocks = Math.ceil(values.length / STATE_BLOCK);
  const codes = new Uint8Array(values.length), absmax = new Float32Array(blocks);
  for (let b = 0; b < blocks; b++) {
    const end = Math.min(values.length, (b + 1) * STATE_BLOCK);
    let am = 0;
    for (let i = b * STATE_BLOCK; i < end; i++) am = Math.max(am, Math.abs(values[i]));
    absmax[b] = am;
    for (let i = b * STATE_BLOCK; i < end; i++) {
      codes[i] = nearestCode(map, am > 0 ? Math.fround(values[i] / am) : 0);
    }
  }
  return [codes, absmax];
}

/**
 * `s` with each parameter's f32 `expAvg` / `expAvgSq` stored as `specs(i)`
 * asks (parameter i's buffers in the optimizer loading it); buffers already
 * in that form, or not f32, are left for the state dict's own checks.
 */
export function quantizeStates(
  s: OptimizerStateDict,
  specs: (param: number) => Record<string, StateSpec> | null,
  extra: Pick<OptimizerStateDict, "stateDtype" | "min8bitSize">,
): OptimizerStateDict {
  const signed = dynamicCode(true), unsigned = dynamicCode(false);
  const state = s.state.map((p, i) => {
    const want = specs(i), b = p?.buffers;
    if (!want || !(b?.expAvg instanceof Float32Array) || !(b.expAvgSq instanceof Float32Array)) {
      return p;
    }
    const buffers: Record<string, StateBuffer> = { ...b };
    if (want.expAvg?.format === "bf16") {
      buffers.expAvg = bf16FromF32(b.expAvg);
      buffers.expAvgSq = bf16FromF32(b.expAvgSq);
    } else if (want.expAvg?.format === "u8") {
      [buffers.expAvg, buffers.expAvgAbsmax] = quantize8bit(b.expAvg, signed);
      [buffers.expAvgSq, buffers.expAvgSqAbsmax] = quantize8bit(b.expAvgSq, unsigned);
    }
    return { ...p, buffers };
  });
  return { ...s, ...extra, state };
}
