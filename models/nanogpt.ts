/**
 * nanoGPT's names for the tiny GPT's tensors, both ways: a nanoGPT checkpoint
 * (karpathy/nanoGPT's `model.py`, its `state_dict()` saved as safetensors)
 * loads strictly into a {@link Gpt}, and a Gpt's state loads strictly
 * into nanoGPT's `GPT`.
 *
 * | Gpt                        | nanoGPT                             |
 * | ------------------------------ | ----------------------------------- |
 * | `tokens.weight`                | `transformer.wte.weight`            |
 * | `positions.weight`             | `transformer.wpe.weight`            |
 * | `blocks.{i}.norm1.*`           | `transformer.h.{i}.ln_1.*`          |
 * | `blocks.{i}.attention.qkv.*`   | `transformer.h.{i}.attn.c_attn.*`   |
 * | `blocks.{i}.attention.output.*`| `transformer.h.{i}.attn.c_proj.*`   |
 * | `blocks.{i}.norm2.*`           | `transformer.h.{i}.ln_2.*`          |
 * | `blocks.{i}.fc1.*`             | `transformer.h.{i}.mlp.c_fc.*`      |
 * | `blocks.{i}.fc2.*`             | `transformer.h.{i}.mlp.c_proj.*`    |
 * | `norm.*`                       | `transformer.ln_f.*`                |
 * | `head.*`                       | `lm_head.*`                         |
 *
 * Layouts agree tensor for tensor (Linear weights are [out, in] in both, and
 * `c_attn`'s rows are q, k, v as `qkv`'s), so only names change. Stock
 * nanoGPT is a Gpt with `tieEmbeddings: true, headBias: false,
 * gelu: "none"` and `bias` as its config's: {@link nanoGptConfig} reads those
 * from a checkpoint.
 *
 * Tied weights: nanoGPT's `state_dict()` lists the shared table under both
 * `transformer.wte.weight` and `lm_head.weight`, and so does `toNanoGpt` (one
 * tensor under both names). `fromNanoGpt` also takes a file that kept only
 * one of the two (safetensors' `save_model` drops duplicates): the missing
 * name gets the same value. A tied Gpt refuses two different values.
 *
 * @module
 */
import type { StateValue, Tensor } from "../mod.ts";
import { ValueError } from "../mod.ts";
import type { Gpt, GptConfig } from "./gpt.ts";

/** Gpt's name prefix and nanoGPT's; `#` is a block index. */
const RENAMES: readonly (readonly [string, string])[] = [
  ["tokens.", "transformer.wte."],
  ["positions.", "transformer.wpe."],
  ["blocks.#.norm1.", "transformer.h.#.ln_1."],
  ["blocks.#.attention.qkv.", "transformer.h.#.attn.c_attn."],
  ["blocks.#.attention.output.", "transformer.h.#.attn.c_proj."],
  ["blocks.#.norm2.", "transformer.h.#.ln_2."],
  ["blocks.#.fc1.", "transformer.h.#.mlp.c_fc."],
  ["blocks.#.fc2.", "transformer.h.#.mlp.c_proj."],
  ["norm.", "transformer.ln_f."],
  ["head.", "lm_head."],
];

const TIED = { table: "transformer.wte.weight", head: "lm_head.weight" } as const;

/** What torch.compile prefixes to every name (nanoGPT's train.py strips it too). */
const COMPILED_PREFIX = "_orig_mod.";

/** The causal mask nanoGPT registers as a buffer without PyTorch 2's flash attention. */
const MASK = /^transformer\.h\.\d+\.attn\.bias$/;

/** `name` under the other naming (nanoGPT's when `toNanoGpt`), or null when no rule matches. */
export function renameNanoGpt(name: string, toNanoGpt: boolean): string | null {
  for (const pair of RENAMES) {
    const [from, to] = toNanoGpt ? pair : [pair[1], pair[0]];
    const pattern = new RegExp(
      `^${from.replaceAll(".", "\\.").replace("#", "(\\d+)")}(weight|bias)$`,
    );
    const m = pattern.exec(name);
    if (m) return m.length === 3 ? to.replace("#", m[1]) + m[2] : to + m[1];
  }
  return null;
}

/** Up to three names for an error message. */
function listed(names: string[]): string {
  const shown = names.slice(0, 3).map((n) => JSON.stringify(n.slice(0, 60))).join(", ");
  return names.length > 3 ? `${shown} and ${names.length - 3} more` : shown;
}

/**
 * The model's state under nanoGPT's names (the live tensors, not copies):
 * save it with `saveSafetensors`, and PyTorch's nanoGPT `GPT` loads it with
 * `load_state_dict(strict=True)` when the model has nanoGPT's options
 * (`tieEmbeddings`, no `headBias`). A tied table is listed under both
 * `transformer.wte.weight` and `lm_head.weight`, as nanoGPT's `state_dict()`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu } from "../mod.ts";
 * import { Gpt } from "./gpt.ts";
 * import { toNanoGpt } from "./nanogpt.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Gpt({
 *   vocab: 5, context: 4, layers: 1, dim: 8, heads: 2, tieEmbeddings: true, headBias: false,
 * });
 * const state = toNanoGpt(model);
 * assert.equal(state.get("lm_head.weight"), state.get("transformer.wte.weight"));
 * assert.ok(state.has("transformer.h.0.attn.c_attn.weight"));
 * gpu.destroy();
 * ```
 */
export function toNanoGpt(model: Gpt): Map<string, Tensor> {
  const out = new Map<string, Tensor>();
  for (const [name, t] of model.stateDict()) {
    const theirs = renameNanoGpt(name, true);
    if (theirs === null) {
      throw new ValueError(`toNanoGpt: no nanoGPT name for ${JSON.stringify(name)}.`);
    }
    out.set(theirs, t);
  }
  return out;
}

/**
 * A nanoGPT state (names as its `GPT.state_dict()`, e.g. read from a
 * safetensors file) under Gpt's names, for `model.loadStateDict` (strict:
 * every name checked). Accepts what nanoGPT's files hold besides: names with
 * torch.compile's `_orig_mod.` prefix, the `attn.bias` causal-mask buffers of
 * PyTorch < 2, and a tied table kept under one name only (both halfstep
 * names then get it). Any other name is a `ValueError` listing it.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { fromNanoGpt } from "./nanogpt.ts";
 * const table = { dtype: "f32" as const, shape: [5, 8], data: new Uint8Array(160) };
 * const state = fromNanoGpt(new Map([["_orig_mod.transformer.wte.weight", table]]));
 * assert.equal(state.get("tokens.weight"), table);
 * assert.equal(state.get("head.weight"), table);
 * ```
 */
export function fromNanoGpt(state: ReadonlyMap<string, StateValue>): Map<string, StateValue> {
  const plain = new Map<string, StateValue>();
  for (const [name, value] of state) {
    const bare = name.startsWith(COMPILED_PREFIX) ? name.slice(COMPILED_PREFIX.length) : name;
    if (!MASK.test(bare)) plain.set(bare, value);
  }
  // nanoGPT always ties: a file that kept one of the two names means the other.
  const table = plain.get(TIED.table) ?? plain.get(TIED.head);
  if (table) {
    for (const name of [TIED.table, TIED.head]) if (!plain.has(name)) plain.set(name, table);
  }
  const out = new Map<string, StateValue>(), unknown: string[] = [];
  for (const [name, value] of plain) {
    const ours = renameNanoGpt(name, false);
    if (ours === null) unknown.push(name);
    else out.set(ours, value);
  }
  if (unknown.length > 0) {
    throw new ValueError(
      `fromNanoGpt: ${listed(unknown)} ${
        unknown.length === 1 ? "is not a name" : "are not names"
      } ` +
        "of nanoGPT's GPT (transformer.wte/wpe/h.{i}/ln_f, lm_head).",
    );
  }
  return out;
}

/**
 * The {@link GptConfig} of a nanoGPT state (nanoGPT's names): sizes from
 * the tables, `layers` from the highest block index, `bias` from whether
 * `ln_1` has one, `headBias` from `lm_head.bias`, the exact GELU, and
 * `tieEmbeddings` unless the state holds two different tables (different
 * tensors, or host data with different bytes). The head count is not in the
 * weights: pass nanoGPT's `n_head`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { nanoGptConfig } from "./nanogpt.ts";
 * const f32 = (shape: number[]) => ({ dtype: "f32" as const, shape, data: new Uint8Array(0) });
 * const state = new Map([
 *   ["transformer.wte.weight", f32([65, 32])],
 *   ["transformer.wpe.weight", f32([64, 32])],
 *   ["transformer.h.0.ln_1.weight", f32([32])],
 *   ["transformer.h.1.ln_1.weight", f32([32])],
 * ]);
 * const config = nanoGptConfig(state, { heads: 4 });
 * assert.deepEqual([config.vocab, config.layers, config.bias], [65, 2, false]);
 * ```
 */
export function nanoGptConfig(
  state: ReadonlyMap<string, StateValue>,
  options: { heads: number },
): GptConfig {
  const named = fromNanoGpt(state);
  const tokens = named.get("tokens.weight"), positions = named.get("positions.weight");
  if (!tokens || !positions) {
    throw new ValueError(
      "nanoGptConfig: the state lacks transformer.wte.weight or transformer.wpe.weight.",
    );
  }
  const blocks = [...named.keys()].map((n) => /^blocks\.(\d+)\./.exec(n)?.[1])
    .filter((i) => i !== undefined).map(Number);
  const head = named.get("head.weight")!;
  return {
    vocab: tokens.shape[0],
    context: positions.shape[0],
    dim: tokens.shape[1],
    layers: blocks.length > 0 ? Math.max(...blocks) + 1 : 0,
    heads: options.heads,
    bias: named.has("blocks.0.norm1.bias"),
    headBias: named.has("head.bias"),
    tieEmbeddings: sameValue(tokens, head),
    gelu: "none",
  };
}

/** Whether two state values are one tensor (one GPU buffer) or equal host bytes. */
function sameValue(a: StateValue, b: StateValue): boolean {
  const bytes = (v: StateValue) => "data" in v && v.data instanceof Uint8Array ? v.data : null;
  const x = bytes(a), y = bytes(b);
  if (!x || !y) return !x && !y && (a as Tensor).buffer === (b as Tensor).buffer;
  return x.byteLength === y.byteLength && x.every((v, i) => v === y[i]);
}
