/**
 * The character-level data of the tiny GPT example: a word list (the npm
 * package `an-array-of-english-words` by default, english_words.ts),
 * shuffled with a seed and split by word into training and validation sets,
 * each encoded as one stream "\nword\nword\n…" of character ids, plus the
 * add-one-smoothed bigram baseline the model has to beat. Nothing here
 * touches the GPU.
 *
 * @module
 */
import { RandomGenerator } from "../../mod.ts";

/** The separator between words, and the first character of every stream. */
export const NEWLINE = "\n";

/** A word list split into encoded training and validation streams. */
export interface WordCorpus {
  /** The characters, id order: newline first, then the letters sorted. */
  vocab: string[];
  /** Training words (for novelty checks of samples). */
  trainWords: ReadonlySet<string>;
  /** Number of validation words. */
  validationWords: number;
  /** The training stream of character ids. */
  train: Int32Array;
  /** The validation stream of character ids. */
  validation: Int32Array;
}

/** Options of {@link splitWords}. */
export interface SplitOptions {
  /** Seed of the word shuffle (default 0). */
  seed?: number;
  /** Fraction of the words held out for validation (default 0.05). */
  validationFraction?: number;
}

/** "\nw1\nw2\n…\n" as ids. */
function encode(words: readonly string[], ids: ReadonlyMap<string, number>): Int32Array {
  const length = words.reduce((n, w) => n + w.length + 1, 1);
  const out = new Int32Array(length);
  let at = 0;
  out[at++] = ids.get(NEWLINE)!;
  for (const w of words) {
    for (const ch of w) out[at++] = ids.get(ch)!;
    out[at++] = ids.get(NEWLINE)!;
  }
  return out;
}

/**
 * Shuffles `words` with a seeded Fisher–Yates shuffle (the list is sorted, so
 * a split without one would hold out only z-words), holds out a fraction of
 * them and encodes both parts.
 */
export function splitWords(words: readonly string[], options: SplitOptions = {}): WordCorpus {
  const fraction = options.validationFraction ?? 0.05;
  const order = [...words];
  const draws = new RandomGenerator(options.seed ?? 0).uniform(order.length);
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(draws[i] * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  const held = Math.max(1, Math.round(order.length * fraction));
  const validation = order.slice(0, held), train = order.slice(held);
  const letters = new Set<string>();
  for (const w of words) for (const ch of w) letters.add(ch);
  letters.delete(NEWLINE);
  const vocab = [NEWLINE, ...[...letters].sort()];
  const ids = new Map(vocab.map((ch, i) => [ch, i]));
  return {
    vocab,
    trainWords: new Set(train),
    validationWords: validation.length,
    train: encode(train, ids),
    validation: encode(validation, ids),
  };
}

/**
 * Evaluation windows: `count` consecutive non-overlapping windows of
 * `context + 1` ids from the start of `stream` (window k starts at k·context),
 * so every target position is scored exactly once. Returns inputs and targets,
 * each [count, context] flattened. `count` shrinks to what the stream holds.
 */
export function evaluationWindows(
  stream: Int32Array,
  context: number,
  count: number,
): { inputs: Int32Array; targets: Int32Array; count: number } {
  const n = Math.min(count, Math.floor((stream.length - 1) / context));
  const inputs = new Int32Array(n * context), targets = new Int32Array(n * context);
  for (let w = 0; w < n; w++) {
    inputs.set(stream.subarray(w * context, (w + 1) * context), w * context);
    targets.set(stream.subarray(w * context + 1, (w + 1) * context + 1), w * context);
  }
  return { inputs, targets, count: n };
}

/** Fills `inputs` and `targets` ([batch, context] each) with windows at random offsets. */
export function sampleBatch(
  stream: Int32Array,
  context: number,
  rng: RandomGenerator,
  inputs: Int32Array,
  targets: Int32Array,
): void {
  const batch = inputs.length / context;
  const starts = rng.uniform(batch);
  for (let b = 0; b < batch; b++) {
    const s = Math.floor(starts[b] * (stream.length - context - 1));
    inputs.set(stream.subarray(s, s + context), b * context);
    targets.set(stream.subarray(s + 1, s + context + 1), b * context);
  }
}

/**
 * The bigram baseline: P(b | a) = (count(a→b) + 1) / (count(a) + V) from the
 * consecutive pairs of `train` (add-one smoothing over V = `vocabSize`), and
 * its cross-entropy in nats per character on the pairs (inputs[i] → targets[i]).
 */
export function bigramCrossEntropy(
  train: Int32Array,
  inputs: Int32Array,
  targets: Int32Array,
  vocabSize: number,
): number {
  const counts = new Float64Array(vocabSize * vocabSize);
  const totals = new Float64Array(vocabSize);
  for (let i = 0; i + 1 < train.length; i++) {
    counts[train[i] * vocabSize + train[i + 1]]++;
    totals[train[i]]++;
  }
  let nats = 0;
  for (let i = 0; i < inputs.length; i++) {
    const a = inputs[i], b = targets[i];
    nats -= Math.log((counts[a * vocabSize + b] + 1) / (totals[a] + vocabSize));
  }
  return nats / inputs.length;
}

/**
 * A user's own text as a character-level corpus (nanoGPT's shakespeare-char
 * workflow): the characters in order of first code point (newline first, as
 * samples start and end at one), the first part of the text for training and
 * the end held out (`validationFraction`, default 0.1; in order, so no
 * held-out window overlaps a training one). "Words" are the text's lines:
 * a sample is new when no training line equals it.
 */
export function textCorpus(
  text: string,
  options: { validationFraction?: number } = {},
): WordCorpus {
  const chars = Array.from(text);
  const letters = new Set(chars);
  letters.delete(NEWLINE);
  const vocab = [NEWLINE, ...[...letters].sort()];
  const ids = new Map(vocab.map((ch, i) => [ch, i]));
  const stream = Int32Array.from(chars, (ch) => ids.get(ch)!);
  const held = Math.round(stream.length * (options.validationFraction ?? 0.1));
  const cut = stream.length - held;
  const trainText = chars.slice(0, cut).join("");
  return {
    vocab,
    trainWords: new Set(trainText.split(NEWLINE)),
    validationWords: chars.slice(cut).join("").split(NEWLINE).length,
    train: stream.slice(0, cut),
    validation: stream.slice(cut),
  };
}
