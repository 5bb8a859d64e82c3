/**
 * The low-precision dtype autocast runs its low-precision list in: f16 (the
 * default, needs `shader-f16`) or bf16 (the same 8-bit exponent as f32, so
 * gradients neither overflow nor underflow and loss scaling is off by default;
 * stored two values to a u32 word, so it needs no `shader-f16` at all).
 */
import { DTypeError, fail, shortValue } from "../gpu/mod.ts";

/** A dtype autocast can run ops in, as `torch.autocast(dtype=...)` takes float16 or bfloat16. */
export type AmpDType = "f16" | "bf16";

/** Every {@link AmpDType}, the default first. */
export const AMP_DTYPES: readonly AmpDType[] = ["f16", "bf16"];

/**
 * `dtype` checked (undefined gives the default, f16): anything else, from
 * plain JavaScript or a typo, is a DTypeError naming `where` and the valid
 * choices.
 *
 * @param where The function or class, e.g. `"autocast"`.
 * @param dtype The `dtype` option as given.
 * @returns The dtype to use.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { DTypeError } from "../gpu/mod.ts";
 * import { ampDType } from "./amp_dtype.ts";
 * assert.equal(ampDType("autocast", undefined), "f16");
 * assert.equal(ampDType("autocast", "bf16"), "bf16");
 * // The refusal lists the valid dtypes.
 * assert.throws(() => ampDType("autocast", "bfloat16"), DTypeError);
 * assert.throws(() => ampDType("autocast", "bfloat16"), /"f16", "bf16"/);
 * ```
 */
export function ampDType(where: string, dtype: unknown): AmpDType {
  if (dtype === undefined) return "f16";
  if (!AMP_DTYPES.includes(dtype as AmpDType)) {
    fail(
      DTypeError,
      where,
      `dtype ${shortValue(dtype)} is not an autocast dtype; use one of ` +
        `${AMP_DTYPES.map((d) => `"${d}"`).join(", ")} (default "f16").`,
    );
  }
  return dtype as AmpDType;
}
