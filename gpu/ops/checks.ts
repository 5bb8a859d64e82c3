/** Input checks shared by ops; every message names the op, the shapes and the dtypes. */
import { DTypeError, ValueError } from "../base/errors.ts";
import { Tensor } from "../tensor/tensor.ts";
import { shortValue } from "../base/short_text.ts";

/**
 * Throws unless every value is a live-or-disposed Tensor: from plain
 * JavaScript a number or an array passed where a tensor belongs would
 * otherwise fail later with a TypeError deep inside the op.
 */
export function assertTensors(op: string, ...values: unknown[]): void {
  values.forEach((v, i) => {
    if (v instanceof Tensor) return;
    const which = values.length === 1 ? "the input" : `operand ${i + 1}`;
    throw new ValueError(
      `${op}: ${which} must be a Tensor, got ${shortValue(v)} (${typeof v}); ` +
        "make one with Tensor.from(values, shape).",
    );
  });
}

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
