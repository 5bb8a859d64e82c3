/**
 * A user's text for `gpt2.ts`: read as UTF-8, GPT-2's tokens, split in order
 * into training tokens (the first part) and held-out tokens (the end), so no
 * held-out window overlaps a training one. Training draws windows at random
 * offsets and validation scores consecutive windows, as the tiny GPT's word
 * streams do (`data/words.ts`).
 *
 * @module
 */
import { UsageError } from "../cli/flags.ts";
import { readUtf8 } from "./text_file.ts";
import { encodeGpt2 } from "../../models/mod.ts";

/** A text's tokens, split. */
export interface TokenSplit {
  train: Int32Array;
  validation: Int32Array;
  /** Characters of the text (for the report). */
  characters: number;
}

/**
 * The tokens of the file at `path`, split with `validation` (a share) held
 * out. Throws a UsageError when a part cannot hold one window of
 * `context` + 1 tokens or the file is not UTF-8 text, a RunFileError when it
 * cannot be read (exit status 1).
 */
export async function loadTextTokens(
  path: string,
  options: { validation: number; context: number },
): Promise<TokenSplit> {
  const text = await readUtf8("data", path);
  const ids = Int32Array.from(encodeGpt2(text));
  const held = Math.round(ids.length * options.validation);
  const train = ids.subarray(0, ids.length - held), validation = ids.subarray(ids.length - held);
  const need = options.context + 1;
  if (train.length < need || validation.length < need) {
    throw new UsageError(
      `--data ${path}: ${ids.length} tokens make ${train.length} training and ` +
        `${validation.length} held-out tokens; each part needs at least --context + 1 = ${need} ` +
        "(give more text, or lower --context).",
    );
  }
  return { train, validation, characters: text.length };
}
