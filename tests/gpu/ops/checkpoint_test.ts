import assert from "node:assert/strict";
import {
  autocast,
  BatchNorm,
  BatchNorm2d,
  causalSoftmax,
  checkpoint,
  checkpointSequential,
  Conv2d,
  Dropout,
  fusedCausalAttentionPacked,
  GELU,
  LayerNorm,
  Linear,
  MaxPool2d,
  mean,
  type Module,
  RandomGenerator,
  ReLU,
  Sequential,
  square,
  sum,
  Tensor,
  tidy,
} from "../../../mod.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";

const WIDTH = 24, BATCH = 16;

/** 32 blocks of Linear → LayerNorm → GELU → Dropout, seeded so two copies are identical. */
function deepMlp(): Sequential {
  const init = new RandomGenerator(1), drop = new RandomGenerator(2);
  const layers: Module[] = [];
  for (let i = 0; i < 32; i++) {
    layers.push(
      new Linear(WIDTH, WIDTH, { seed: init }),
      new LayerNorm(WIDTH),
      new GELU(),
      new Dropout(0.1, { seed: drop }),
    );
  }
  return new Sequential(...layers);
}

function bnMlp(): Sequential {
  const init = new RandomGenerator(3);
  const layers: Module[] = [];
  for (let i = 0; i < 8; i++) {
    layers.push(new Linear(WIDTH, WIDTH, { seed: init }), new BatchNorm(WIDTH), new ReLU());
  }
  return new Sequential(...layers);
}

const input = () =>
  Tensor.from(new RandomGenerator(9).uniform(BATCH * WIDTH, -1, 1), [BATCH, WIDTH]);

/** Autocast off, or on in a half dtype. */
type Amp = false | "f16" | "bf16";

/** One forward + backward; returns every parameter gradient and buffer, read back. */
async function gradients(
  model: Sequential,
  amp: Amp,
  x = input(),
): Promise<(Float32Array | Int32Array)[]> {
  const loss = tidy(() =>
    autocast(() => mean(square(model.forward(x))), {
      enabled: amp !== false,
      dtype: amp === false ? undefined : amp,
    })
  );
  loss.backward();
  loss.dispose();
  x.dispose();
  const out: (Float32Array | Int32Array)[] = [];
  for (const p of model.parameters()) out.push(await p.grad!.read());
  for (const [, b] of model.namedBuffers()) out.push(await b.read());
  model.zeroGrad();
  return out;
}

Deno.test({
  name:
    "checkpointing: a 32-block MLP with LayerNorm, GELU and Dropout gets bit-identical gradients, f32 and AMP in f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const amp of [false, "f16", "bf16"] as const) {
      const plain = deepMlp(), checkpointed = deepMlp();
      checkpointed.checkpoint = "auto";
      const expected = await gradients(plain, amp);
      const actual = await gradients(checkpointed, amp);
      assert.equal(checkpointed.lastCheckpointPlan!.segments.length, Math.round(Math.sqrt(128)));
      // Same kernels on the same inputs in the same order: no tolerance needed.
      assert.deepEqual(actual, expected, `amp=${amp}`);
      // The recompute replayed the dropout masks instead of drawing new ones.
      const offsets = (m: Sequential) =>
        m.layers.filter((l) => l instanceof Dropout).map((l) => (l as Dropout).generator.offset);
      assert.deepEqual(offsets(checkpointed), offsets(plain));
    }
  },
});

Deno.test({
  name:
    "checkpointing: BatchNorm gradients and running statistics equal the plain step's, f32 and AMP in f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const amp of [false, "f16", "bf16"] as const) {
      const plain = bnMlp(), checkpointed = bnMlp();
      checkpointed.checkpoint = 3;
      for (let step = 0; step < 2; step++) {
        const label = `amp=${amp} step ${step}`;
        assert.deepEqual(await gradients(checkpointed, amp), await gradients(plain, amp), label);
      }
    }
  },
});

/** Peak bytes of one forward + backward of a fresh `make()` with checkpointing `spec`. */
async function peakOf(
  make: () => Sequential,
  input: () => Tensor,
  spec: "auto" | null,
): Promise<number> {
  const model = make();
  model.checkpoint = spec;
  const x = input();
  if (spec) tidy(() => void model.forward(x)); // plan once (measures layer outputs) before measuring
  await gpu.sync();
  const before = gpu.memoryStats().allocatedBytes;
  gpu.resetPeakMemory();
  const loss = tidy(() => mean(square(model.forward(x))));
  loss.backward();
  const peak = gpu.memoryStats().peakBytes - before;
  loss.dispose();
  model.dispose();
  x.dispose();
  return peak;
}

/** 8 blocks of Conv2d 3×3 → BatchNorm2d → ReLU on 16×16 images, then a max pool. */
function convNet(): Sequential {
  const init = new RandomGenerator(4);
  const layers: Module[] = [];
  for (let i = 0; i < 8; i++) {
    const conv = new Conv2d(i === 0 ? 3 : 8, 8, 3, { padding: 1, seed: init });
    layers.push(conv, new BatchNorm2d(8), new ReLU());
  }
  return new Sequential(...layers, new MaxPool2d(2));
}

const images = () =>
  Tensor.from(new RandomGenerator(8).uniform(4 * 3 * 16 * 16, -1, 1), [4, 3, 16, 16]);

Deno.test({
  name: "checkpointing a CNN: bit-identical gradients (f32, AMP in f16 and bf16), BatchNorm " +
    "statistics moved once, lower peak",
  ...GPU_TEST,
  async fn() {
    for (const amp of [false, "f16", "bf16"] as const) {
      const plain = convNet(), checkpointed = convNet();
      checkpointed.checkpoint = "auto";
      for (let step = 0; step < 2; step++) {
        // Gradients, running statistics and num_batches_tracked: equal bit for bit.
        const expected = await gradients(plain, amp, images());
        assert.deepEqual(await gradients(checkpointed, amp, images()), expected, `amp=${amp}`);
      }
      const counts = checkpointed.namedBuffers().filter(([name]) => name.endsWith("tracked"));
      for (const [name, t] of counts) assert.equal((await t.read())[0], 2, name);
      plain.dispose();
      checkpointed.dispose();
    }
    const plainPeak = await peakOf(convNet, images, null);
    const checkpointedPeak = await peakOf(convNet, images, "auto");
    assert.ok(
      checkpointedPeak < 0.75 * plainPeak,
      `peak ${checkpointedPeak} vs plain ${plainPeak}`,
    );
  },
});

Deno.test({
  name: "checkpointing: peak memory of a deep model falls to at most half with √n segments",
  ...GPU_TEST,
  async fn() {
    const make = () => {
      const init = new RandomGenerator(5);
      const layers: Module[] = [];
      for (let i = 0; i < 32; i++) layers.push(new Linear(64, 64, { seed: init }), new GELU());
      return new Sequential(...layers);
    };
    const x = () => Tensor.from(new RandomGenerator(6).uniform(512 * 64), [512, 64]);
    const plain = await peakOf(make, x, null);
    const checkpointed = await peakOf(make, x, "auto");
    assert.ok(checkpointed <= plain / 2, `checkpointed peak ${checkpointed} vs plain ${plain}`);
  },
});

Deno.test({
  name: "checkpointing: a budget picks the fewest segments that fit and says when none does",
  ...GPU_TEST,
  fn() {
    const model = deepMlp();
    const x = input();
    const { output, plan } = checkpointSequential(model.layers, { budgetBytes: 40_000 }, x);
    assert.ok(plan.fits && plan.estimatedPeakBytes <= 40_000, JSON.stringify(plan));
    assert.ok(plan.estimatedPeakBytes < plan.plainPeakBytes);
    const fewer = checkpointSequential(model.layers, { budgetBytes: 60_000 }, x).plan;
    assert.ok(fewer.segments.length <= plan.segments.length);
    const impossible = checkpointSequential(model.layers, { budgetBytes: 1000 }, x).plan;
    assert.equal(impossible.fits, false);
    output.dispose();
    assert.throws(
      () => checkpointSequential(model.layers, 0, x),
      /checkpointSequential: 0 is not a checkpoint spec; give a segment count/,
    );
  },
});

Deno.test({
  name: "checkpoint: a recompute that differs from the first run is a clear error",
  ...GPU_TEST,
  fn() {
    const x = Tensor.from([1, 2, 3, 4], [4], { requiresGrad: true });
    let calls = 0;
    const y = checkpoint((t) => (++calls === 1 ? square(t) : tidy(() => sum(t))), x);
    const loss = sum(y);
    assert.throws(
      () => loss.backward(),
      /checkpoint: the recomputed output is f32 \[\] but the first run gave f32 \[4\]/,
    );
  },
});

Deno.test({
  name: "checkpoint: parameters inside the region get gradients even when the input needs none",
  ...GPU_TEST,
  async fn() {
    const layer = new Linear(3, 2, { seed: 1 });
    const x = Tensor.from([1, 2, 3], [1, 3]);
    const plain = tidy(() => sum(layer.forward(x)));
    plain.backward();
    const expected = await layer.weight.grad!.read();
    layer.zeroGrad();
    const checkpointed = tidy(() => sum(checkpoint((t) => layer.forward(t), x)));
    checkpointed.backward();
    assert.deepEqual(await layer.weight.grad!.read(), expected);
  },
});

/**
 * A bf16 attention block at odd sizes: fused attention over packed q/k/v ([2, 7, 3·7], one
 * head of size 7, dropout drawn inside), then a causal softmax of its [2, 7, 7] output.
 * Returns the input's gradient and the generator's offset after the step.
 */
async function bf16AttentionStep(checkpointed: boolean): Promise<[number[], number]> {
  const generator = new RandomGenerator(12);
  const qkv = Tensor.from(new RandomGenerator(13).uniform(2 * 7 * 21, -2, 2), [2, 7, 21], {
    dtype: "bf16",
    requiresGrad: true,
  });
  const block = (x: Tensor) =>
    tidy(() => {
      const dropout = { p: 0.2, range: generator.take(2 * 7 * 7) };
      return causalSoftmax(fusedCausalAttentionPacked(x, { heads: 1, dropout }), { scale: 3 });
    });
  const y = checkpointed ? checkpoint(block, qkv) : block(qkv);
  assert.equal(y.dtype, "bf16");
  const g = Tensor.from(new RandomGenerator(14).uniform(2 * 7 * 7, -1, 1), [2, 7, 7], {
    dtype: "bf16",
  });
  y.backward({ gradient: g });
  const grad = [...await qkv.grad!.read()];
  assert.equal(qkv.grad!.dtype, "bf16");
  [qkv, y, g].forEach((t) => t.dispose());
  return [grad, generator.offset];
}

Deno.test({
  name: "checkpoint: a bf16 attention block with dropout gets the plain run's gradients, bit " +
    "for bit, and replays its mask",
  ...GPU_TEST,
  async fn() {
    const [expected, offset] = await bf16AttentionStep(false);
    const [actual, checkpointedOffset] = await bf16AttentionStep(true);
    assert.ok(expected.some((v) => v !== 0), "the gradient is not all zeros");
    assert.deepEqual(actual, expected);
    assert.equal(checkpointedOffset, offset, "the recompute drew no new numbers");
  },
});
