/** One softmax / log-softmax test case: seeded logits, forward and backward against f64. */
import { type FloatDType, logSoftmax, softmax, Tensor } from "../../gpu/mod.ts";
import { quantize, softmax64, softmaxBackward64, uniform } from "./reference.ts";
import { assertClose, TOL } from "./assert.ts";

/**
 * Runs softmax (or log-softmax, `log`) on [rows, cols] `dtype` logits in
 * [-30, 30) seeded by `seed` (large: a naive exp would overflow, the max
 * shift must keep it finite), then its backward; y and dx must match the f64
 * references within TOL[dtype]. `where` names the case in failures.
 */
export async function checkSoftmaxCase(
  rows: number,
  cols: number,
  dtype: FloatDType,
  options: { log: boolean; seed: number; where: string },
): Promise<void> {
  const { log, seed } = options;
  const label = `${log ? "log_softmax" : "softmax"} ${options.where}`;
  const x = quantize(uniform(rows * cols, seed, -30, 30), dtype);
  const g = quantize(uniform(rows * cols, 2), dtype);
  const tx = Tensor.from(x, [rows, cols], { dtype, requiresGrad: true });
  const y = (log ? logSoftmax : softmax)(tx);
  const ref = softmax64(x, cols, log);
  // log-softmax values reach −60; f16 and bf16 store them with a relative half-ulp.
  assertClose(await y.read(), ref, TOL[dtype], label);
  y.backward({ gradient: Tensor.from(g, [rows, cols], { dtype }) });
  const dx = softmaxBackward64(ref, g, cols, log);
  assertClose(await tx.grad!.read(), dx, TOL[dtype], `${label} grad`);
  for (const t of [tx.grad!, tx, y]) t.dispose();
}
