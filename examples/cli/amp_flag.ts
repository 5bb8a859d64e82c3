/**
 * `--amp [f16|bf16]`: a flag that may take a value. node's `parseArgs` has
 * no optional values, so the dtype is taken out of the arguments first:
 * `--amp` alone (and `--fp16`) stays f16, `--amp bf16` or `--amp=bf16` picks
 * bf16 (no loss scaling, no shader-f16 needed).
 */
import { UsageError } from "./flags.ts";

/** The dtypes `--amp` takes. */
export const AMP_FLAG_DTYPES = ["f16", "bf16"] as const;

/** What `--amp` asked for. */
export type AmpFlagDtype = (typeof AMP_FLAG_DTYPES)[number];

/**
 * `args` with the value of `--amp` removed (so the flag parses as a boolean)
 * and the dtype it named (f16 when it named none). A value other than f16
 * or bf16 after `--amp=` is a UsageError; after `--amp ` a word that is not
 * a flag is too (the examples take no positional arguments).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { ampDtypeFlag } from "./amp_flag.ts";
 * const { args, dtype } = ampDtypeFlag(["--amp", "bf16", "--epochs", "1"]);
 * assert.equal(dtype, "bf16");
 * assert.equal(args.join(" "), "--amp --epochs 1");
 * assert.equal(ampDtypeFlag(["--amp", "--epochs", "1"]).dtype, "f16");
 * ```
 */
export function ampDtypeFlag(args: readonly string[]): { args: string[]; dtype: AmpFlagDtype } {
  const out: string[] = [];
  let dtype: AmpFlagDtype = "f16";
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    const inline = arg.startsWith("--amp=") ? arg.slice("--amp=".length) : undefined;
    const next = arg === "--amp" ? args[i + 1] : undefined;
    const value = inline ?? (next !== undefined && !next.startsWith("-") ? next : undefined);
    if (arg === "--amp" || inline !== undefined) out.push("--amp");
    else out.push(arg);
    if (value === undefined) continue;
    if (!(AMP_FLAG_DTYPES as readonly string[]).includes(value)) {
      throw new UsageError(`--amp takes f16 (the default) or bf16, not "${value.slice(0, 40)}".`);
    }
    dtype = value as AmpFlagDtype;
    if (inline === undefined) i++;
  }
  return { args: out, dtype };
}

/** What a run prints for its precision: "f32", "AMP" (f16) or "AMP bf16". */
export function precisionName(amp: boolean, dtype: AmpFlagDtype): string {
  return !amp ? "f32" : dtype === "bf16" ? "AMP bf16" : "AMP";
}

/** The start line's precision: "f32", "AMP (f16 + loss scaling)" or "AMP (bf16, no loss scaling)". */
export function precisionDetail(amp: boolean, dtype: AmpFlagDtype): string {
  return !amp
    ? "f32"
    : dtype === "bf16"
    ? "AMP (bf16, no loss scaling)"
    : "AMP (f16 + loss scaling)";
}
