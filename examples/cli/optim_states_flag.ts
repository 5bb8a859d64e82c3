/**
 * `--optim-states f32|bf16|8bit`, shared by the GPT examples and mnist: how
 * Adam or AdamW keeps its moments (`AdamOptions.stateDtype`; docs/optimizer_states.md).
 * 8bit is bitsandbytes' AdamW8bit (2 bytes a parameter instead of 8),
 * bf16 torchao's bf16 states (4 bytes).
 */
import type { StateDtype } from "../../mod.ts";
import { choiceFlag } from "./flags.ts";

/** The values the flag takes. */
export const OPTIM_STATES: readonly StateDtype[] = ["f32", "bf16", "8bit"];

/** The flag's lines in a help text, the description from column `column`. */
export function optimStatesHelp(column: number, optimizer = "AdamW"): string {
  const pad = (text: string) => text.padEnd(column);
  return [
    `${pad("  --optim-states S")}how ${optimizer} keeps its moments: f32 (default), bf16`,
    `${pad("")}(torchao's, stochastic rounding) or 8bit (bitsandbytes'`,
    `${pad("")}AdamW8bit: one byte each, a scale per 256; tensors under`,
    `${pad("")}4096 elements keep f32); see docs/optimizer_states.md`,
  ].join("\n");
}

/** The value of `--optim-states` (a UsageError for another word). */
export function optimStatesFlag(text: string): StateDtype {
  return choiceFlag("optim-states", text, OPTIM_STATES);
}

/** AdamW's moment bytes a parameter for `states` (8bit: its block scales included). */
export function stateBytesPerParameter(states: StateDtype): number {
  return states === "f32" ? 8 : states === "bf16" ? 4 : 2 + 8 / 256;
}
