/**
 * `--grad-dtype f32|f16|bf16`, shared by the GPT examples: what the fp32
 * masters' gradients are kept in (`AmpTrainerOptions.gradDtype`, apex O2's
 * half-precision gradients; docs/optimizer_states.md). f16 needs `--amp`,
 * bf16 `--amp bf16`, and both `--accum 1`: accumulated gradients are summed
 * in f32.
 */
import type { AmpDType, GradDType } from "../../mod.ts";
import { choiceFlag, UsageError } from "./flags.ts";

/** The values the flag takes. */
export const GRAD_DTYPES: readonly GradDType[] = ["f32", "f16", "bf16"];

/** The flag's lines in a help text, the description from column `column`. */
export function gradDtypeHelp(column: number): string {
  const pad = (text: string) => text.padEnd(column);
  return [
    `${pad("  --grad-dtype D")}what the fp32 masters' gradients are kept in: f32`,
    `${pad("")}(default), f16 (with --amp) or bf16 (with --amp bf16): 2 bytes`,
    `${pad("")}a parameter instead of 4, unscaled as the fused AdamW reads`,
    `${pad("")}them (apex O2); needs --accum 1; see docs/optimizer_states.md`,
  ].join("\n");
}

/**
 * The value of `--grad-dtype` (a UsageError for another word, or one that
 * does not fit the AMP flags or `--accum`).
 */
export function gradDtypeFlag(
  text: string,
  run: { amp: boolean; ampDtype: AmpDType; accum: number },
): GradDType {
  const dtype = choiceFlag("grad-dtype", text, GRAD_DTYPES);
  if (dtype === "f32") return dtype;
  const amp = dtype === "f16" ? "--amp" : "--amp bf16";
  if (!run.amp || run.ampDtype !== dtype) {
    throw new UsageError(`--grad-dtype ${dtype} needs ${amp}: gradients are kept in its dtype.`);
  }
  if (run.accum > 1) {
    throw new UsageError(
      `--grad-dtype ${dtype} needs --accum 1: gradients accumulated over micro-batches are ` +
        "summed in f32; drop --grad-dtype or --accum.",
    );
  }
  return dtype;
}
