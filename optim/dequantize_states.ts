/**
 * Adam's compact moments (8-bit codes with block scales, bf16 bits) as the
 * f32 values they stand for: what `torch.optim.AdamW` holds, so a
 * PyTorch program continues a halfstep run from its state.
 */
import type { OptimizerStateDict, StateBuffer } from "./_optimizer_state.ts";
import { f32FromBf16 } from "../gpu/mod.ts";
import { dynamicCode } from "./_dynamic_code.ts";
import { STATE_BLOCK } from "./kernels/compact_update.ts";

let maps: { signed: Float32Array; unsigned: Float32Array } | null = null;

/** 8-bit codes times their block's absmax, through bitsandbytes' signed or unsigned map. */
function dequantize8bit(codes: Uint8Array, absmax: Float32Array, signed: boolean): Float32Array {
  maps ??= { signed: dynamicCode(true), unsigned: dynamicCode(false) };
  const map = signed ? maps.signed : maps.unsigned;
  return Float32Array.from(codes, (c, i) => map[c] * absmax[Math.floor(i / STATE_BLOCK)]);
}

/**
 * `s` with every compact moment as f32 values: 8-bit `expAvg` / `expAvgSq`
 * dequantized (code × block absmax; the absmax buffers dropped), bf16 ones
 * widened. f32 states are shared, not copied; `stateDtype` and
 * `min8bitSize` are left out. Dequantizing loses nothing the update uses:
 * the kernel dequantizes the same way before each step.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AdamW, dequantizeStates, initGpu, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const w = Tensor.zeros([4096], { requiresGrad: true });
 * const opt = new AdamW([w], { stateDtype: "8bit" });
 * w.grad = Tensor.full([4096], 0.5);
 * opt.step();
 * const plain = dequantizeStates(await opt.stateDict());
 * assert.deepStrictEqual(Object.keys(plain.state[0].buffers), ["expAvg", "expAvgSq"]);
 * assert.ok(Math.abs(plain.state[0].buffers.expAvg[0] - 0.05) < 1e-7); // (1 − β₁) · 0.5
 * gpu.destroy();
 * ```
 */
export function dequantizeStates(s: OptimizerStateDict): OptimizerStateDict {
  const { stateDtype: _, min8bitSize: __, ...rest } = s;
  const state = s.state.map((p) => {
    const b = p.buffers;
    const buffers: Record<string, StateBuffer> = {};
    for (const [name, data] of Object.entries(b)) {
      if (name === "expAvgAbsmax" || name === "expAvgSqAbsmax") continue;
      const absmax = b[`${name}Absmax`] as Float32Array | undefined;
      buffers[name] = data instanceof Uint8Array && absmax
        ? dequantize8bit(data, absmax, name === "expAvg")
        : data instanceof Uint16Array
        ? f32FromBf16(data)
        : data;
    }
    return { ...p, buffers };
  });
  return { ...rest, state };
}
