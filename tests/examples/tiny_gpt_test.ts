import assert from "node:assert/strict";
import { autocast, crossEntropy, RandomGenerator, Tensor, tidy } from "../../mod.ts";
import { Gpt, type GptConfig } from "../../models/mod.ts";
import { bigramCrossEntropy, evaluationWindows, splitWords } from "../../examples/data/words.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";

const CONFIG: GptConfig = { vocab: 11, context: 32, layers: 4, dim: 32, heads: 4, seed: 3 };
const BATCH = 8;

/** One forward + backward of a fresh model; its parameter gradients and the step's peak bytes. */
async function run(checkpointed: boolean, amp: boolean) {
  const model = new Gpt(CONFIG);
  if (checkpointed) model.blocks.checkpoint = CONFIG.layers;
  const draws = new RandomGenerator(5).uniform(2 * BATCH * CONFIG.context);
  const ids = Array.from(draws, (u) => Math.floor(u * CONFIG.vocab));
  const n = BATCH * CONFIG.context;
  const x = Tensor.from(ids.slice(0, n), [BATCH, CONFIG.context], { dtype: "i32" });
  const targets = ids.slice(n);
  if (checkpointed) tidy(() => autocast(() => model.forward(x), { enabled: amp })); // plan once
  gpu.resetPeakMemory();
  const before = gpu.memoryStats().allocatedBytes;
  const loss = tidy(() =>
    autocast(() => crossEntropy(model.forward(x), targets), { enabled: amp })
  );
  loss.backward();
  const peak = gpu.memoryStats().peakBytes - before;
  loss.dispose();
  x.dispose();
  const grads: [string, Float32Array | Int32Array][] = [];
  for (const [name, p] of model.namedParameters()) grads.push([name, await p.grad!.read()]);
  model.dispose();
  return { grads, peak };
}

Deno.test({
  name: "Gpt: checkpointed blocks give bit-identical gradients with less peak memory, f32 and AMP",
  ...GPU_TEST,
  async fn() {
    for (const amp of [false, true]) {
      const plain = await run(false, amp);
      const checkpointed = await run(true, amp);
      assert.equal(plain.grads.length, 2 + CONFIG.layers * 12 + 4); // embeddings, blocks, norm + head
      // The recompute runs the same kernels on the same inputs: no tolerance.
      assert.deepEqual(checkpointed.grads, plain.grads, `amp=${amp}`);
      assert.ok(
        checkpointed.peak < 0.75 * plain.peak,
        `amp=${amp}: checkpointed peak ${checkpointed.peak} vs plain ${plain.peak}`,
      );
    }
  },
});

Deno.test({
  name: "Gpt: logits shape, and ids longer than the context are a clear error",
  ...GPU_TEST,
  fn() {
    const model = new Gpt({ ...CONFIG, context: 4 });
    tidy(() => {
      const ids = Tensor.from([1, 2, 3, 4, 5, 6], [2, 3], { dtype: "i32" });
      assert.deepEqual(model.forward(ids).shape, [6, CONFIG.vocab]);
      assert.throws(
        () => model.forward(Tensor.from([1, 2, 3, 4, 5], [1, 5], { dtype: "i32" })),
        /Gpt: ids must be i32 \[batch, T\] with T <= 4; got i32 \[1, 5\]/,
      );
    });
    model.dispose();
  },
});

Deno.test("words data: a seeded split by word, newline-separated streams, the bigram baseline", () => {
  const words = ["ab", "ba", "abc", "c", "cab", "bb", "a", "ca"];
  const corpus = splitWords(words, { seed: 1, validationFraction: 0.25 });
  assert.deepEqual(corpus.vocab, ["\n", "a", "b", "c"]);
  assert.equal(corpus.validationWords, 2);
  assert.deepEqual(splitWords(words, { seed: 1, validationFraction: 0.25 }), corpus);
  const decode = (s: Int32Array) => Array.from(s, (i) => corpus.vocab[i]).join("");
  const train = decode(corpus.train), validation = decode(corpus.validation);
  assert.ok(train.startsWith("\n") && train.endsWith("\n") && validation.startsWith("\n"));
  const held = validation.split("\n").filter(Boolean);
  assert.deepEqual([...train.split("\n").filter(Boolean), ...held].sort(), [...words].sort());
  assert.ok(held.every((w) => !corpus.trainWords.has(w)));

  // Windows score every target once: targets are the inputs shifted by one.
  const w = evaluationWindows(corpus.train, 3, 100);
  assert.equal(w.count, Math.floor((corpus.train.length - 1) / 3));
  assert.deepEqual([...w.targets], [...corpus.train.subarray(1, w.count * 3 + 1)]);

  // Add-one bigram on the stream 0 1 0 1 1 (V = 2): counts 0→1: 2, 1→0: 1, 1→1: 1.
  const stream = Int32Array.from([0, 1, 0, 1, 1]);
  const pairs = { inputs: Int32Array.from([0, 1, 1, 0]), targets: Int32Array.from([1, 0, 1, 0]) };
  const expected = -(Math.log(3 / 4) + Math.log(2 / 4) + Math.log(2 / 4) + Math.log(1 / 4)) / 4;
  const actual = bigramCrossEntropy(stream, pairs.inputs, pairs.targets, 2);
  assert.ok(Math.abs(actual - expected) < 1e-12, `${actual} vs ${expected}`);
});
