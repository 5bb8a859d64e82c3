/** Input checks shared by ops; every message names the op, the shapes and the dtypes. */
import { DTypeError, ValueError } from "../errors.ts";
import type { Tensor } from "../tensor.ts";

/** Throws unless `a` and `b` have the same dtype. */
export function assertSameDtype(op: string, a: Tensor, b: Tensor): void {
  if (a.dtype !== b.dtype) {
    throw new DTypeError(
      `${op}: dtypes differ (${a.describe()} and ${b.describe()}). ` +
        "Cast one operand with cast(x, dtype) first, or run under autocast.",
    );
  }
}

/** Throws unless `a` and `b` live on the same device. */
export function assertSameGpu(op: string, a: Tensor, b: Tensor): void {
  if (a.gpu !== b.gpu) {
    throw new ValueError(
      `${op}: operands ${a.describe()} and ${b.describe()} are on different devices.`,
    );
  }
}
