/**
 * The models users load and train, built on halfstep's public API: a GPT
 * (decoder-only transformer; the tiny GPT of examples/tiny_gpt.ts and GPT-2
 * are one class, configured), GPT-2 from Hugging Face's safetensors and back,
 * nanoGPT's names, GPT-2's tokenizer, and sampling with a KV cache.
 *
 * ```ts ignore
 * import { generate, loadGpt2 } from "@halfstep/halfstep/models";
 * ```
 *
 * Imported apart from the library's root (`@halfstep/halfstep/models`, or
 * `models/mod.ts` by URL) because the tokenizer brings GPT-2's ranks
 * (js-tiktoken), which a page that only trains an MLP should not download.
 *
 * @module
 */
export { Gpt, type GptConfig } from "./gpt.ts";
export {
  configBeside,
  fromHuggingFace,
  GPT2_124M,
  GPT2_HEADS,
  type Gpt2Checkpoint,
  gpt2Checkpoint,
  gpt2Config,
  gpt2FromEntries,
  type Gpt2JsonConfig,
  type Gpt2Sizes,
  gpt2SizesOf,
  headsOf,
  initGpt2,
  loadGpt2,
  saveGpt2,
  toHuggingFace,
} from "./gpt2.ts";
export { decodeGpt2, encodeGpt2, END_OF_TEXT, GPT2_VOCAB } from "./gpt2_tokenizer.ts";
export { fromNanoGpt, nanoGptConfig, renameNanoGpt, toNanoGpt } from "./nanogpt.ts";
export { generate, KvCache, pickToken, type SamplingOptions } from "./sampling.ts";
