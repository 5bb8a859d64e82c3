/**
 * Sampling from a GPT (a {@link Gpt}: GPT-2 or the tiny one) with a KV
 * cache, so each new token costs one position, not the whole context.
 *
 * Per block the cache holds the keys and values of every position so far,
 * head-major, f32 [B·H, L, D] (L = the longest sequence asked for), written
 * in place (`copyInto`). A step feeds n new tokens at positions t..t+n−1
 * (the prompt at once, then one at a time): their q, k and v come from the
 * block's own projection, k and v go into the cache, and the queries attend
 * over all L cached rows with a mask that hides the positions not yet seen
 * (−1e30 before the softmax: weight 0). The cost of a step is fixed by L,
 * not by how far the sequence has come: the per-token time stays flat
 * (`bench.ts gpt2` measures it). Sampling runs in f32 with no tape.
 *
 * @module
 */
import {
  add,
  copyInto,
  matmul,
  narrow,
  noGrad,
  permute,
  RandomGenerator,
  reshape,
  scale,
  softmax,
  split,
  Tensor,
  tidy,
  type TransformerBlock,
} from "../mod.ts";
import type { Gpt } from "./gpt.ts";

/** Hides a position from attention: exp(−1e30 − max) is 0 in f32 (finite, unlike −Infinity). */
const HIDDEN = -1e30;

/** [B, n, H·D] → [B·H, n, D]. */
function heads(x: Tensor, h: number): Tensor {
  const [b, n, c] = x.shape, d = c / h;
  return tidy(() => reshape(permute(reshape(x, [b, n, h, d]), [0, 2, 1, 3]), [b * h, n, d]));
}

/** [B·H, n, D] → [B, n, H·D]. */
function merged(o: Tensor, b: number, h: number): Tensor {
  const [, n, d] = o.shape;
  return tidy(() => reshape(permute(reshape(o, [b, h, n, d]), [0, 2, 1, 3]), [b, n, h * d]));
}

/** The keys and values of every block for `batch` sequences of up to `length` tokens. */
export class KvCache {
  /** Positions filled so far. */
  position = 0;
  readonly #keys: Tensor[];
  readonly #values: Tensor[];

  /** An empty cache for `model`, `batch` sequences and at most `length` positions (≤ context). */
  constructor(readonly model: Gpt, readonly batch: number, readonly length: number) {
    const { context, dim, heads: h, layers } = model.config;
    if (!Number.isInteger(length) || length < 1 || length > context) {
      throw new RangeError(`KvCache: length must be 1..${context} (the context), got ${length}.`);
    }
    const shape = [batch * h, length, dim / h];
    this.#keys = Array.from({ length: layers }, () => Tensor.zeros(shape));
    this.#values = Array.from({ length: layers }, () => Tensor.zeros(shape));
  }

  /**
   * Feeds ids (row-major [batch, n]) at the next n positions and returns the
   * logits of the last one, [batch, V] (f32). No autograd.
   */
  step(ids: ArrayLike<number>): Tensor {
    const n = ids.length / this.batch, t = this.position;
    if (!Number.isInteger(n) || n < 1 || t + n > this.length) {
      throw new RangeError(
        `KvCache: ${ids.length} ids do not make [${this.batch}, n] new positions after ` +
          `${t} of ${this.length}.`,
      );
    }
    const model = this.model, { dim } = model.config, b = this.batch;
    // Query i (position t + i) sees keys 0..t+i.
    const mask = new Float32Array(n * this.length).fill(HIDDEN);
    for (let i = 0; i < n; i++) mask.fill(0, i * this.length, i * this.length + t + i + 1);
    const logits = noGrad(() =>
      tidy(() => {
        const positions = Array.from({ length: n }, (_, i) => t + i);
        let x = add(
          model.embed(Tensor.from(ids, [b, n], { dtype: "i32" })),
          model.positions.forward(Tensor.from(positions, [n], { dtype: "i32" })),
        );
        const hidden = Tensor.from(mask, [n, this.length]);
        model.blocks.layers.forEach((layer, i) => {
          x = this.#block(layer as TransformerBlock, x, i, hidden);
        });
        const last = reshape(narrow(x, 1, n - 1, 1), [b, dim]);
        return model.headLogits(last);
      })
    );
    this.position += n;
    return logits;
  }

  /** One block over the new positions x [B, n, C], keys and values into the cache. */
  #block(block: TransformerBlock, x: Tensor, i: number, hidden: Tensor): Tensor {
    const { dim, heads: h } = this.model.config, b = this.batch;
    const [q, k, v] = split(block.attention.qkv.forwardNormalized(x, block.norm1), [
      dim,
      dim,
      dim,
    ], -1);
    copyInto(this.#keys[i], heads(k, h), { axis: 1, start: this.position });
    copyInto(this.#values[i], heads(v, h), { axis: 1, start: this.position });
    const scores = scale(
      matmul(heads(q, h), this.#keys[i], { transB: true }),
      1 / Math.sqrt(dim / h),
    );
    const weights = softmax(add(scores, hidden));
    const a = block.attention.output.forward(merged(matmul(weights, this.#values[i]), b, h));
    const x1 = add(x, a);
    return add(x1, block.fc2.forward(block.fc1.forwardNormalized(x1, block.norm2)));
  }

  /** Frees the cache. */
  dispose(): void {
    for (const t of [...this.#keys, ...this.#values]) t.dispose();
  }
}

/** How {@link generate} picks each token. */
export interface SamplingOptions {
  /** Tokens to add to each prompt. */
  maxNewTokens: number;
  /** 0: the most likely token (greedy); else softmax(logits / temperature). Default 1. */
  temperature?: number;
  /** Draw among the k most likely tokens only (default: all). */
  topK?: number;
  /** Seed of the draws (default 0). */
  seed?: number;
  /**
   * Recompute the whole context for every token instead of using a KV cache
   * (default false): the reference the cache is tested against.
   */
  recompute?: boolean;
}

/** The next token of one row of logits. */
export function pickToken(
  logits: ArrayLike<number>,
  options: { temperature: number; topK?: number },
  draw: number,
): number {
  let order = Array.from({ length: logits.length }, (_, i) => i);
  if (options.temperature === 0) {
    return order.reduce((best, i) => (logits[i] > logits[best] ? i : best), 0);
  }
  if (options.topK !== undefined && options.topK < logits.length) {
    order = order.sort((a, b) => logits[b] - logits[a]).slice(0, options.topK);
  }
  const max = Math.max(...order.map((i) => logits[i]));
  const weights = order.map((i) => Math.exp((logits[i] - max) / options.temperature));
  let u = draw * weights.reduce((a, w) => a + w, 0);
  for (let j = 0; j < order.length; j++) if ((u -= weights[j]) < 0) return order[j];
  return order[order.length - 1];
}

/**
 * `maxNewTokens` tokens after each prompt (all prompts the same length),
 * greedy at temperature 0, else drawn from softmax(logits / T) among the
 * `topK` most likely. Returns the new ids of each prompt. **Syncs once per
 * token** (the logits are read to pick it).
 *
 * @example
 * ```ts ignore
 * const [ids] = await generate(model, [encodeGpt2("Hello")], { maxNewTokens: 20, temperature: 0 });
 * ```
 */
export async function generate(
  model: Gpt,
  prompts: number[][],
  options: SamplingOptions,
): Promise<number[][]> {
  const b = prompts.length, start = prompts[0]?.length ?? 0;
  if (b === 0 || start === 0 || prompts.some((p) => p.length !== start)) {
    throw new RangeError("generate: give one or more non-empty prompts of one length.");
  }
  const total = start + options.maxNewTokens;
  if (total > model.config.context) {
    throw new RangeError(
      `generate: ${start} prompt tokens + ${options.maxNewTokens} new ones exceed the context ` +
        `of ${model.config.context}.`,
    );
  }
  const pick = { temperature: options.temperature ?? 1, topK: options.topK };
  const rng = new RandomGenerator(options.seed ?? 0);
  const seqs = prompts.map((p) => [...p]);
  const cache = options.recompute ? null : new KvCache(model, b, total);
  const wasTraining = model.training;
  model.eval();
  try {
    let next: number[] = seqs.flat();
    for (let step = 0; step < options.maxNewTokens; step++) {
      const logits = cache ? cache.step(next) : lastLogits(model, seqs);
      const values = await logits.read(); // [B, V]: the sync point
      logits.dispose();
      const v = values.length / b, draws = rng.uniform(b);
      next = seqs.map((s, row) => {
        const id = pickToken(values.subarray(row * v, (row + 1) * v), pick, draws[row]);
        s.push(id);
        return id;
      });
    }
  } finally {
    cache?.dispose();
    if (wasTraining) model.train();
  }
  return seqs.map((s) => s.slice(start));
}

/** The last position's logits [B, V] from the whole context (no cache). */
function lastLogits(model: Gpt, seqs: number[][]): Tensor {
  const b = seqs.length, t = seqs[0].length;
  return noGrad(() =>
    tidy(() => {
      const all = model.forward(Tensor.from(seqs.flat(), [b, t], { dtype: "i32" })); // [B·T, V]
      const rows = reshape(all, [b, t, model.config.vocab]);
      return reshape(narrow(rows, 1, t - 1, 1), [b, model.config.vocab]);
    })
  );
}
