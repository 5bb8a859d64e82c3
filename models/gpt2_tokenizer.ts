/**
 * GPT-2's tokenizer: byte-level BPE over GPT-2's 50,257 ids (50,000 merges,
 * 256 bytes and `<|endoftext|>` = 50256), from the npm package js-tiktoken,
 * pinned. Why that package: it is the JavaScript port of OpenAI's tiktoken
 * kept by tiktoken's JavaScript maintainer (the same BPE and the same rank
 * files that produced GPT-2's published ids), pure JavaScript with one small
 * dependency (no WebAssembly, so it runs in Deno and browsers alike), and it
 * ships GPT-2's ranks inside the package (`js-tiktoken/ranks/gpt2`), so
 * nothing is downloaded at run time. Encoding is byte-level, so any string
 * round-trips: `decode(encode(s)) === s`.
 *
 * @module
 */
import { Tiktoken } from "npm:js-tiktoken@1.0.21/lite";
import gpt2Ranks from "npm:js-tiktoken@1.0.21/ranks/gpt2";

/** GPT-2's vocabulary size (the model's table rows). */
export const GPT2_VOCAB = 50257;

/** The id of `<|endoftext|>`, GPT-2's document separator. */
export const END_OF_TEXT = 50256;

let shared: Tiktoken | null = null;

/** The tokenizer, built once (the ranks are parsed on first use, ~0.3 s). */
function tokenizer(): Tiktoken {
  shared ??= new Tiktoken(gpt2Ranks);
  return shared;
}

/**
 * GPT-2's ids for `text`. A literal `<|endoftext|>` in the text becomes the
 * separator id 50256, as in GPT-2's training data.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { decodeGpt2, encodeGpt2 } from "./gpt2_tokenizer.ts";
 * assert.equal(encodeGpt2("hello world").join(), "31373,995"); // tiktoken's own test
 * assert.equal(decodeGpt2(encodeGpt2("héllo 世界 🙃")), "héllo 世界 🙃");
 * ```
 */
export function encodeGpt2(text: string): number[] {
  return tokenizer().encode(text, "all");
}

/** The text of GPT-2 ids (each in [0, 50257)). */
export function decodeGpt2(ids: ArrayLike<number>): string {
  for (let i = 0; i < ids.length; i++) {
    if (!Number.isInteger(ids[i]) || ids[i] < 0 || ids[i] >= GPT2_VOCAB) {
      throw new RangeError(`decodeGpt2: id ${ids[i]} at ${i} is not a GPT-2 id (0..50256).`);
    }
  }
  return tokenizer().decode(Array.from(ids));
}
