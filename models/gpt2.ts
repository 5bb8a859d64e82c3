/**
 * GPT-2 as Hugging Face publishes it (`model.safetensors` of
 * openai-community/gpt2 and its larger siblings), both ways: a file loads
 * into a {@link Gpt} of GPT-2's options, and a Gpt saves under the
 * names of `transformers`' `GPT2LMHeadModel.state_dict()`, so that
 * `model.load_state_dict(load_file(path), strict=True)` takes it.
 *
 * The names are nanoGPT's ({@link fromNanoGpt}), which are Hugging Face's
 * with a `transformer.` prefix (the published files have none; both load).
 * One layout differs: GPT-2's projections are `Conv1D`s whose weights are
 * stored [in, out], the transpose of a Linear's [out, in]; they are
 * transposed on the way in and out. The `attn.bias` / `attn.masked_bias`
 * buffers older files carry (the causal mask, a constant) are ignored, and
 * `lm_head.weight`, where a file has it, must equal `wte` (GPT-2 ties them).
 * A token table over one buffer's limit is loaded into column pieces
 * (`tableShards`) and joined again on saving.
 * Sizes come from the tensors; the head count, which no tensor shows, from a
 * `config.json` beside the file (which `--heads` may not contradict), else
 * `--heads`, else the file's own metadata (`n_head`, as halfstep writes it),
 * else the published sizes' widths. A tensor holding NaN or ±Inf is refused
 * under its own name.
 *
 * @module
 */
import { nonFiniteCount } from "../nn/mod.ts";
import {
  type HostTensor,
  RandomGenerator,
  type SafetensorsEntry,
  ShapeError,
  type StateValue,
  type Tensor,
  ValueError,
} from "../mod.ts";
import { dirname, join } from "node:path";
import { loadSafetensors, saveSafetensors } from "../files.ts";
import { fromNanoGpt, renameNanoGpt } from "./nanogpt.ts";
import { Gpt, type GptConfig } from "./gpt.ts";

/** Heads of the published GPT-2 sizes, by width: 124M, 355M, 774M and 1.5B. */
export const GPT2_HEADS: Readonly<Record<number, number>> = {
  768: 12,
  1024: 16,
  1280: 20,
  1600: 25,
};

/** GPT-2's sizes: the rest of a {@link GptConfig} is fixed by the architecture. */
export interface Gpt2Sizes {
  /** Token table rows (50,257 for the published models). */
  vocab: number;
  /** Positions (1,024 for the published models). */
  context: number;
  /** Transformer blocks. */
  layers: number;
  /** Model width C. */
  dim: number;
  /** Attention heads. */
  heads: number;
}

/** The 124M model's sizes (GPT-2 "small"). */
export const GPT2_124M: Gpt2Sizes = {
  vocab: 50257,
  context: 1024,
  layers: 12,
  dim: 768,
  heads: 12,
};

/**
 * A Gpt config for GPT-2 of these sizes: learned positions, pre-LN
 * blocks with biases, the tanh GELU ("gelu_new"), LayerNorm eps 1e-5, and a
 * head tied to the token table without a bias. With `maxBufferBytes` (one
 * buffer's limit on the adapter) the f32 token table is kept in as few
 * column pieces as fit it (124M: 154 MB, two pieces under WebGPU's default
 * 128 MiB).
 */
export function gpt2Config(sizes: Gpt2Sizes, seed = 0, maxBufferBytes = Infinity): GptConfig {
  let tableShards = 1;
  while (
    tableShards < sizes.dim &&
    (sizes.dim % tableShards !== 0 || 4 * sizes.vocab * sizes.dim / tableShards > maxBufferBytes)
  ) tableShards++;
  return {
    ...sizes,
    tieEmbeddings: true,
    headBias: false,
    bias: true,
    gelu: "tanh",
    seed,
    tableShards,
  };
}

/** The causal-mask buffers some files carry. */
const MASKS = /^h\.\d+\.attn\.(bias|masked_bias)$/;

/** The Conv1D weights, stored [in, out]. */
const CONV1D = /^h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$/;

/** Every tensor of GPT-2's blocks, with its shape at width `c`. */
function blockShapes(c: number): [string, number[]][] {
  return [
    ["ln_1.weight", [c]],
    ["ln_1.bias", [c]],
    ["attn.c_attn.weight", [c, 3 * c]],
    ["attn.c_attn.bias", [3 * c]],
    ["attn.c_proj.weight", [c, c]],
    ["attn.c_proj.bias", [c]],
    ["ln_2.weight", [c]],
    ["ln_2.bias", [c]],
    ["mlp.c_fc.weight", [c, 4 * c]],
    ["mlp.c_fc.bias", [4 * c]],
    ["mlp.c_proj.weight", [4 * c, c]],
    ["mlp.c_proj.bias", [c]],
  ];
}

/** Up to three names for a message. */
function listed(names: string[]): string {
  const shown = names.slice(0, 3).map((n) => JSON.stringify(n.slice(0, 60))).join(", ");
  return names.length > 3 ? `${shown} and ${names.length - 3} more` : shown;
}

/** The entries without the `transformer.` prefix, masks and a tied `lm_head.weight`. */
function bareEntries(entries: ReadonlyMap<string, SafetensorsEntry>): Map<string, HostTensor> {
  const bare = new Map<string, HostTensor>();
  let head: HostTensor | undefined;
  for (const [name, value] of entries) {
    const plain = name.startsWith("transformer.") ? name.slice("transformer.".length) : name;
    if (plain === "lm_head.weight") head = value;
    else if (!MASKS.test(plain)) bare.set(plain, value);
  }
  const table = bare.get("wte.weight");
  if (head && table && !sameBytes(head, table)) {
    throw new ValueError(
      "GPT-2: lm_head.weight differs from wte.weight; GPT-2 ties them (an untied head is not " +
        "GPT-2's architecture).",
    );
  }
  return bare;
}

/** Whether two host tensors hold the same bytes (a plain loop: 154 MB for the 124M's table). */
function sameBytes(a: HostTensor, b: HostTensor): boolean {
  if (a.dtype !== b.dtype || a.data.byteLength !== b.data.byteLength) return false;
  const x = a.data, y = b.data;
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
}

/** The fields of a Hugging Face GPT-2 `config.json` this loader reads. */
export interface Gpt2JsonConfig {
  /** Attention heads. */
  n_head?: number;
  /** Model width. */
  n_embd?: number;
  /** Transformer blocks. */
  n_layer?: number;
  /** Positions. */
  n_positions?: number;
  /** Token table rows. */
  vocab_size?: number;
  /** LayerNorm's ε (GPT-2's 1e-5 only). */
  layer_norm_epsilon?: number;
  /** The MLP's activation: the tanh GELU only (`gelu_new` or `gelu_pytorch_tanh`). */
  activation_function?: string;
}

/** A file's GPT-2 tensors, checked: its sizes and its tensors under the bare names. */
export interface Gpt2Checkpoint {
  /** The sizes its tensors (and config) give. */
  sizes: Gpt2Sizes;
  /** The tensors without the `transformer.` prefix, the masks and a tied `lm_head.weight`. */
  tensors: Map<string, HostTensor>;
}

/**
 * GPT-2's sizes from a file's tensors (with or without `transformer.`), the
 * head count from `json` (a `config.json`), `heads` (--heads), `savedHeads`
 * (the file's metadata), or the published widths. Throws a HalfstepError, in
 * Hugging Face's names, naming what is missing, misshapen, foreign or not
 * finite.
 */
export function gpt2SizesOf(
  entries: ReadonlyMap<string, SafetensorsEntry>,
  options: { json?: Gpt2JsonConfig; heads?: number; savedHeads?: number } = {},
): Gpt2Sizes {
  return gpt2Checkpoint(entries, options).sizes;
}

/**
 * A file's tensors checked as GPT-2's (see {@link gpt2SizesOf}), for
 * {@link gpt2FromEntries}: the names are read once.
 */
export function gpt2Checkpoint(
  entries: ReadonlyMap<string, SafetensorsEntry>,
  options: { json?: Gpt2JsonConfig; heads?: number; savedHeads?: number } = {},
): Gpt2Checkpoint {
  const bare = bareEntries(entries);
  const wte = bare.get("wte.weight"), wpe = bare.get("wpe.weight");
  if (!wte || !wpe || wte.shape.length !== 2 || wpe.shape.length !== 2) {
    throw new ValueError(
      "GPT-2: the file has no wte.weight and wpe.weight tables [vocab, width] and [positions, " +
        "width]: not a GPT-2 checkpoint (Hugging Face's model.safetensors of openai-community/gpt2).",
    );
  }
  const [vocab, dim] = wte.shape, context = wpe.shape[0];
  const indices = [...bare.keys()].map((n) => /^h\.(\d+)\./.exec(n)?.[1]).filter((i) => i)
    .map(Number);
  const layers = indices.length > 0 ? Math.max(...indices) + 1 : 0;
  const expected = new Map<string, number[]>([
    ["wte.weight", [vocab, dim]],
    ["wpe.weight", [context, dim]],
    ["ln_f.weight", [dim]],
    ["ln_f.bias", [dim]],
  ]);
  for (let i = 0; i < layers; i++) {
    for (const [name, shape] of blockShapes(dim)) expected.set(`h.${i}.${name}`, shape);
  }
  const foreign = [...bare.keys()].filter((n) => !expected.has(n));
  if (foreign.length > 0) {
    throw new ValueError(
      `GPT-2: ${listed(foreign)} ${foreign.length === 1 ? "is not a name" : "are not names"} of ` +
        "GPT-2 (wte, wpe, h.{i}.ln_1/attn.c_attn/attn.c_proj/ln_2/mlp.c_fc/mlp.c_proj, ln_f).",
    );
  }
  const missing = [...expected.keys()].filter((n) => !bare.has(n));
  if (missing.length > 0 || layers === 0) {
    throw new ValueError(`GPT-2: the file lacks ${listed(missing.length ? missing : ["h.0.*"])}.`);
  }
  for (const [name, shape] of expected) {
    const got = bare.get(name)!;
    if (got.shape.join() !== shape.join() || !["f32", "f16", "bf16"].includes(got.dtype)) {
      throw new ShapeError(
        `GPT-2: ${name} is ${got.dtype} [${got.shape.join(", ")}], expected a float ` +
          `[${shape.join(", ")}] for width ${dim} (Conv1D weights are stored [in, out]).`,
      );
    }
  }
  const json = options.json ?? {};
  checkJson(json, { vocab, dim, context, layers });
  const heads = headCount(dim, json, options);
  const bad = [...expected.keys()].map((name) => [name, nonFiniteCount(bare.get(name)!)] as const)
    .filter(([, count]) => count > 0);
  if (bad.length > 0) {
    const [name, count] = bad[0];
    const more = bad.length > 1 ? ` (and ${bad.length - 1} more tensor(s))` : "";
    throw new ValueError(
      `GPT-2: ${name} holds ${count} NaN or ±Inf value(s)${more}: the file is damaged, or was ` +
        "saved from a run that diverged; download it again.",
    );
  }
  return { sizes: { vocab, context, layers, dim, heads }, tensors: bare };
}

/**
 * The head count, in the order docs/gpt2.md gives: config.json's n_head
 * (which `heads`, the --heads flag, may repeat but not contradict), else
 * `heads`, else the count the file's own metadata records (`savedHeads`),
 * else the published sizes' by width. Each refusal says why.
 */
function headCount(
  dim: number,
  json: Gpt2JsonConfig,
  options: { heads?: number; savedHeads?: number },
): number {
  const given = json.n_head;
  if (given !== undefined && !(Number.isInteger(given) && given > 0)) {
    throw new ValueError(
      `GPT-2: config.json's n_head is ${JSON.stringify(given).slice(0, 40)}, not a whole ` +
        "number of attention heads.",
    );
  }
  if (given !== undefined && options.heads !== undefined && options.heads !== given) {
    throw new ValueError(
      `GPT-2: --heads ${options.heads}, but the config.json beside the file says n_head ` +
        `${given}, and config.json comes first: drop --heads (it is for a file without one).`,
    );
  }
  const [heads, from] = given !== undefined
    ? [given, "config.json's n_head"]
    : options.heads !== undefined
    ? [options.heads, "--heads"]
    : options.savedHeads !== undefined
    ? [options.savedHeads, "the file's n_head"]
    : [GPT2_HEADS[dim], "the published size's head count"];
  if (heads === undefined) {
    throw new ValueError(
      `GPT-2: width ${dim} is not one of the published sizes (768, 1024, 1280, 1600) and no ` +
        "config.json is beside the file: give the head count with --heads.",
    );
  }
  if (dim % heads !== 0) {
    const divisors = Array.from({ length: dim }, (_, i) => i + 1).filter((d) => dim % d === 0);
    throw new ValueError(
      `GPT-2: ${from} ${heads} does not divide the width ${dim} (each head takes width / ` +
        `heads channels); the divisors are ${divisors.slice(0, 12).join(", ")}` +
        `${divisors.length > 12 ? ", ..." : ""}.`,
    );
  }
  return heads;
}

/** A config.json that contradicts the tensors, or is not GPT-2's, is refused. */
function checkJson(
  json: Gpt2JsonConfig,
  t: { vocab: number; dim: number; context: number; layers: number },
) {
  const pairs: [string, number | undefined, number][] = [
    ["vocab_size", json.vocab_size, t.vocab],
    ["n_embd", json.n_embd, t.dim],
    ["n_positions", json.n_positions, t.context],
    ["n_layer", json.n_layer, t.layers],
  ];
  for (const [key, value, actual] of pairs) {
    if (value !== undefined && value !== actual) {
      throw new ValueError(`GPT-2: config.json says ${key} ${value}, the tensors ${actual}.`);
    }
  }
  if (json.layer_norm_epsilon !== undefined && json.layer_norm_epsilon !== 1e-5) {
    throw new ValueError(
      `GPT-2: config.json's layer_norm_epsilon is ${json.layer_norm_epsilon}; this model has 1e-5.`,
    );
  }
  const gelu = json.activation_function;
  if (gelu !== undefined && gelu !== "gelu_new" && gelu !== "gelu_pytorch_tanh") {
    throw new ValueError(
      `GPT-2: config.json's activation_function is "${gelu}"; this model has the tanh GELU (gelu_new).`,
    );
  }
}

/** A 2-D host tensor transposed (any element size). */
function transposed(t: HostTensor): HostTensor {
  const [rows, cols] = t.shape, size = t.data.byteLength / (rows * cols);
  const out = new Uint8Array(t.data.byteLength);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const from = (r * cols + c) * size, to = (c * rows + r) * size;
      for (let b = 0; b < size; b++) out[to + b] = t.data[from + b];
    }
  }
  return { dtype: t.dtype, shape: [cols, rows], data: out };
}

/**
 * A Hugging Face GPT-2 state (checked with {@link gpt2SizesOf} first) under
 * Gpt's names, Conv1D weights transposed to [out, in]: for
 * `model.loadStateDict`, which loads all or nothing.
 */
export function fromHuggingFace(
  entries: ReadonlyMap<string, SafetensorsEntry>,
  tableShards = 1,
): Map<string, StateValue> {
  return fromBareNames(bareEntries(entries), tableShards);
}

/** {@link fromHuggingFace} of tensors already under the bare names. */
function fromBareNames(
  bare: ReadonlyMap<string, HostTensor>,
  tableShards: number,
): Map<string, StateValue> {
  const nano = new Map<string, StateValue>();
  for (const [name, value] of bare) {
    nano.set(`transformer.${name}`, CONV1D.test(name) ? transposed(value) : value);
  }
  const state = fromNanoGpt(nano);
  if (tableShards > 1) {
    const pieces = columnPieces(state.get("tokens.weight") as HostTensor, tableShards);
    state.set("tokens.weight", pieces[0]);
    state.set("head.weight", pieces[0]);
    pieces.slice(1).forEach((p, i) => state.set(`tokenShards.${i}.weight`, p));
  }
  return state;
}

/** A 2-D host tensor cut into `k` equal pieces along its columns. */
function columnPieces(t: HostTensor, k: number): HostTensor[] {
  const [rows, cols] = t.shape, size = t.data.byteLength / (rows * cols), width = cols / k;
  return Array.from({ length: k }, (_, p) => {
    const data = new Uint8Array(rows * width * size);
    for (let r = 0; r < rows; r++) {
      const from = (r * cols + p * width) * size;
      data.set(t.data.subarray(from, from + width * size), r * width * size);
    }
    return { dtype: t.dtype, shape: [rows, width], data };
  });
}

/** Host tensors joined along their columns (the inverse of {@link columnPieces}). */
function joinedColumns(pieces: HostTensor[]): HostTensor {
  const rows = pieces[0].shape[0], size = pieces[0].data.byteLength / (rows * pieces[0].shape[1]);
  const cols = pieces.reduce((n, p) => n + p.shape[1], 0);
  const data = new Uint8Array(rows * cols * size);
  let at = 0;
  for (const p of pieces) {
    const width = p.shape[1];
    for (let r = 0; r < rows; r++) {
      data.set(
        p.data.subarray(r * width * size, (r + 1) * width * size),
        (r * cols + at) * size,
      );
    }
    at += width;
  }
  return { dtype: pieces[0].dtype, shape: [rows, cols], data };
}

/**
 * The model's state on the host under `GPT2LMHeadModel.state_dict()`'s
 * names (`transformer.*` and `lm_head.weight`, the tied table under both, its
 * pieces joined), Conv1D weights as [in, out]. **A sync point** (reads every
 * tensor).
 */
export async function toHuggingFace(model: Gpt): Promise<Map<string, SafetensorsEntry>> {
  const host = async (t: Tensor): Promise<HostTensor> => {
    const values = await t.read();
    return { dtype: t.dtype, shape: [...t.shape], data: new Uint8Array(values.buffer) };
  };
  const table = joinedColumns(await Promise.all(model.tableWeights().map(host)));
  const out = new Map<string, SafetensorsEntry>();
  for (const [name, tensor] of model.stateDict()) {
    if (name.startsWith("tokenShards.")) continue;
    const theirs = renameNanoGpt(name, true);
    if (theirs === null) throw new ValueError(`toHuggingFace: no GPT-2 name for "${name}".`);
    const bare = theirs.replace(/^transformer\./, "");
    const value = name === "tokens.weight" || name === "head.weight" ? table : await host(tensor);
    const stored = CONV1D.test(bare) ? transposed(value) : value;
    out.set(theirs, { ...stored, shape: [...stored.shape] } as SafetensorsEntry);
  }
  return out;
}

/**
 * The `config.json` beside the weights file `path`, or undefined when there
 * is none; one that cannot be read as JSON is a ValueError naming it.
 */
export async function configBeside(path: string): Promise<Gpt2JsonConfig | undefined> {
  const file = join(dirname(path), "config.json");
  try {
    return JSON.parse(await Deno.readTextFile(file)) as Gpt2JsonConfig;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return undefined;
    throw new ValueError(`GPT-2: ${file} cannot be read as JSON (${(e as Error).message}).`);
  }
}

/**
 * A new Gpt of GPT-2's options holding a checked file's weights (see
 * {@link gpt2Checkpoint}); with `maxBufferBytes` the token table is kept
 * in column pieces that fit one buffer. Loads all or nothing.
 */
export function gpt2FromEntries(
  checkpoint: Gpt2Checkpoint,
  options: { seed?: number; maxBufferBytes?: number } = {},
): Gpt {
  const config = gpt2Config(checkpoint.sizes, options.seed, options.maxBufferBytes);
  const state = fromBareNames(checkpoint.tensors, config.tableShards ?? 1);
  const model = new Gpt(config);
  try {
    model.loadStateDict(state);
  } catch (e) {
    model.dispose();
    throw e;
  }
  return model;
}

/**
 * Loads a GPT-2 `model.safetensors` (F32, F16 or BF16; with or without the
 * `transformer.` prefix) into a new Gpt of its sizes. **Reads the file.**
 *
 * @example
 * ```ts ignore
 * const { model, sizes } = await loadGpt2("model.safetensors"); // config.json beside it, if any
 * ```
 */
export async function loadGpt2(
  path: string,
  options: { heads?: number; seed?: number; maxBufferBytes?: number } = {},
): Promise<{ model: Gpt; sizes: Gpt2Sizes }> {
  const { entries, metadata } = await loadSafetensors(path);
  const checkpoint = gpt2Checkpoint(entries, {
    json: await configBeside(path),
    heads: options.heads,
    savedHeads: headsOf(metadata),
  });
  return { model: gpt2FromEntries(checkpoint, options), sizes: checkpoint.sizes };
}

/**
 * Saves a Gpt of GPT-2's options as Hugging Face's `model.safetensors`
 * (atomically): `GPT2LMHeadModel` loads it with `strict=True`. **A sync point.**
 */
export async function saveGpt2(path: string, model: Gpt): Promise<void> {
  // transformers' from_pretrained wants format "pt"; n_head is what no tensor shows.
  const metadata = { format: "pt", n_head: String(model.config.heads) };
  await saveSafetensors(path, await toHuggingFace(model), { metadata });
}

/** The head count a file saved by {@link saveGpt2} records, if any. */
export function headsOf(metadata: Record<string, string>): number | undefined {
  const n = Number(metadata.n_head);
  return Number.isInteger(n) && n > 0 ? n : undefined;
}

/**
 * GPT-2's own initialisation (Hugging Face's `_init_weights`): weights
 * normal with std 0.02 (0.02/√(2·layers) for the projections into the
 * residual stream), biases 0, LayerNorms 1 and 0, so that a random model
 * starts at a loss near ln(50257) ≈ 10.8 (Gpt's own init is for small
 * models). For `--random`: trying memory and speed without the weights.
 */
export function initGpt2(model: Gpt, seed = 0): void {
  const rng = new RandomGenerator(seed);
  const residual = 0.02 / Math.sqrt(2 * model.config.layers);
  const state = new Map<string, StateValue>();
  for (const [name, t] of model.stateDict()) {
    const n = t.size;
    const values = name.endsWith(".bias")
      ? new Float32Array(n)
      : /norm\d?\.weight$/.test(name)
      ? new Float32Array(n).fill(1)
      : rng.normal(n, 0, /\.(output|fc2)\.weight$/.test(name) ? residual : 0.02);
    state.set(name, { dtype: "f32", shape: [...t.shape], data: new Uint8Array(values.buffer) });
  }
  // Tied names must carry one value: the head's is the table's first piece.
  state.set("head.weight", state.get("tokens.weight")!);
  model.loadStateDict(state);
}
