/**
 * What the numerics inspector and the AmpTrainer carry from one step to the
 * next, over sequences where a later step's event must not overwrite an
 * earlier one. Expected values come from the test's own plan (which layer
 * breaks at which step) and from host-side models of the rules (the loss
 * scaler's in tests/helpers/scaler_reference.ts, SGD and accumulation in plain
 * numbers), never from the code under test.
 */
import assert from "node:assert/strict";
import {
  AmpTrainer,
  crossEntropy,
  Linear,
  mul,
  NumericsInspector,
  scale,
  SGD,
  sum,
  Tensor,
} from "../../mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { rng } from "../helpers/reference.ts";
import { DEFAULT_RULE, ReferenceScaler } from "../helpers/scaler_reference.ts";
import { batch, LABELS, mlp, plant } from "../helpers/inspector_model.ts";

Deno.test({
  name: "NumericsInspector across steps: the first non-finite stays the first over later " +
    "broken steps (an earlier layer breaking later, a grown statistics buffer, reports without " +
    "reset); report({ reset }) starts each epoch afresh",
  ...GPU_TEST,
  async fn() {
    const model = mlp(5);
    const inspector = new NumericsInspector(model);
    const clean = new Map(
      await Promise.all(
        model.namedParameters().map(async ([n, p]) => [n, await p.read()] as const),
      ),
    );
    const restore = () => {
      for (const [n, p] of model.namedParameters()) {
        p.writeBytes(new Uint8Array(Float32Array.from(clean.get(n)!).buffer));
      }
    };
    const x = batch();
    const step = () => {
      crossEntropy(model.forward(x), LABELS).backward();
      model.zeroGrad();
    };
    const first = async (reset = false) => {
      const f = (await inspector.report({ reset })).firstNonFinite;
      return f && [f.step, f.name, f.op, f.phase, f.call];
    };
    const param = (name: string) => model.stateDict().get(name)!;

    // Epoch 1. The plan: step 1 breaks layer "4" (the last), step 2 also layer "0" (the
    // first to run), step 3 adds 70 rows of its own: the first stays step 1's "4".
    inspector.watch(step); // step 0: clean
    await plant(param("4.bias"), 1, NaN);
    inspector.watch(step); // step 1
    await plant(param("0.weight"), 0, Infinity);
    inspector.watch(step); // step 2: "0" breaks before "4" in execution order
    const firstBreak = [1, "4", "linear", "forward", 0];
    assert.deepEqual(await first(), firstBreak, "after step 2");
    assert.deepEqual(await first(), firstBreak, "a second report without reset");
    // 70 ops outside any submodule, each a row of its own: the statistics buffer (64 rows at
    // first) grows by a copy on the GPU, header included.
    const inf = Tensor.from([Infinity, 1], [2]);
    inspector.watch(() => {
      for (let i = 0; i < 70; i++) scale(inf, 2).dispose();
    }); // step 3
    const epoch1 = await inspector.report({ reset: true });
    assert.equal(epoch1.steps, 4);
    assert.ok(epoch1.rows.length > 64, `${epoch1.rows.length} rows: the buffer grew`);
    assert.equal(epoch1.rows.find((r) => r.name === "scale:69")?.nonFinite, 1, "step 3 counted");
    const f1 = epoch1.firstNonFinite!;
    assert.deepEqual([f1.step, f1.name, f1.op, f1.phase, f1.call], firstBreak);

    // Epoch 2: two clean steps report no non-finite; then step 6 breaks layer "2" and step 7
    // layer "0" again: the epoch's first is step 6 (steps keep their numbers).
    restore();
    inspector.watch(step); // step 4
    inspector.watch(step); // step 5
    assert.equal(await first(), null, "a clean stretch after a reset");
    await plant(param("2.bias"), 0, Infinity); // +∞: the fused ReLU would turn −∞ into 0
    inspector.watch(step); // step 6
    await plant(param("0.weight"), 3, NaN);
    inspector.watch(step); // step 7
    assert.deepEqual(await first(true), [6, "2", "linear", "forward", 0]);
    assert.equal(await first(), null, "epoch 3 has seen nothing");
    inf.dispose();
    x.dispose();
    model.dispose();
    inspector.dispose();
  },
});

/**
 * One micro-batch of the trainer test: inputs x [2, 4] and the loss weights
 * c [2, 3] of loss = Σ c ⊙ (x·Wᵀ), so dL/dW = cᵀ·x exactly (small dyadic
 * values) and the f16 gradient of the product is c·scale/accumulation:
 * it overflows f16 where that passes 65504.
 */
interface MicroBatch {
  x: number[];
  c: number[];
}

const ROWS = 2, IN = 4, OUT = 3;

function microBatch(seed: number, cMax: number): MicroBatch {
  const r = rng(seed);
  // Multiples of 1/4 in [-2, 2] and of 1/8 in [-cMax, cMax]: exact in f16 and in every sum here.
  const pick = (n: number, step: number, max: number) =>
    Array.from({ length: n }, () => Math.round((2 * r() - 1) * max / step) * step);
  const c = pick(ROWS * OUT, 1 / 8, cMax);
  c[0] = cMax; // the largest |c| is cMax
  return { x: pick(ROWS * IN, 1 / 4, 2), c };
}

/** dL/dW = cᵀ·x, [OUT, IN]. */
function weightGrad({ x, c }: MicroBatch): number[] {
  const g = new Array(OUT * IN).fill(0);
  for (let r = 0; r < ROWS; r++) {
    for (let o = 0; o < OUT; o++) {
      for (let i = 0; i < IN; i++) g[o * IN + i] += c[r * OUT + o] * x[r * IN + i];
    }
  }
  return g;
}

Deno.test({
  name: "AmpTrainer across effective batches: accumulation, skipped steps and the scale " +
    "follow host models of SGD and the scaler's rule; a skipped batch leaves nothing behind; " +
    "the inspector reports each epoch's first overflow",
  ...GPU_TEST,
  ignore: !gpu.f16,
  async fn() {
    const accumulation = 2, lr = 1 / 8;
    const rule = { ...DEFAULT_RULE, growthInterval: 2 };
    const model = new Linear(IN, OUT, { bias: false, seed: 3 });
    const inspector = new NumericsInspector(model);
    const trainer = new AmpTrainer(model, new SGD(model.parameters(), { lr }), {
      accumulationSteps: accumulation,
      scaler: { growthInterval: rule.growthInterval },
      inspector,
    });
    const ref = new ReferenceScaler(rule);
    let w = Array.from(await model.weight.read()); // the host's master weights
    // Twelve micro-batches, six effective batches. |c| of 3 at scale 2^16 gives f16
    // gradients of 3·2^16/2 = 98304: overflow. At 2^15 it gives 49152: fine; 6 overflows there.
    const plan = [0.5, 0.5, 0.5, 3, 0.5, 0.5, 0.5, 0.5, 3, 1, 0.5, 6];
    const epochs = [6, 6]; // micro-batches per epoch: a report with reset after each
    let micro = 0;
    for (const [e, length] of epochs.entries()) {
      let firstOverflow: [number, number] | null = null; // [micro-batch, scale then]
      let pending: number[] = new Array(OUT * IN).fill(0), overflowed = false;
      for (const end = micro + length; micro < end; micro++) {
        const batch = microBatch(100 + micro, plan[micro]);
        const tx = Tensor.from(batch.x, [ROWS, IN]), tc = Tensor.from(batch.c, [ROWS, OUT]);
        trainer.step(() => sum(mul(model.forward(tx), tc))).dispose();
        tx.dispose();
        tc.dispose();
        // The host model of this micro-batch.
        const overflows = plan[micro] * ref.scale / accumulation > 65504;
        if (overflows && firstOverflow === null) firstOverflow = [micro, ref.scale];
        overflowed ||= overflows;
        pending = pending.map((g, i) => g + weightGrad(batch)[i] / accumulation);
        const at = `micro-batch ${micro} (epoch ${e})`;
        if ((micro + 1) % accumulation !== 0) {
          assert.equal((await trainer.stateDict()).microStep, 1, at);
          assert.deepEqual(Array.from(await model.weight.read()), w, `${at}: no update mid-batch`);
          continue;
        }
        // An effective batch ends: SGD on the unscaled mean gradient, unless it overflowed.
        if (!overflowed) w = w.map((v, i) => Math.fround(v - lr * pending[i]));
        ref.update(overflowed);
        pending = pending.map(() => 0);
        overflowed = false;
        const s = await trainer.stateDict();
        assert.deepEqual(
          [s.steps, s.microStep, s.scaler.scale, s.scaler.growthTracker, s.scaler.skippedSteps],
          [(micro + 1) / accumulation, 0, ref.scale, ref.growthTracker, ref.skippedSteps],
          at,
        );
        assert.equal(await trainer.scaler.lastStepSkipped(), ref.lastSkipped, at);
        assert.deepEqual(Array.from(await model.weight.read()), w, `${at}: master weights`);
      }
      const report = await inspector.report({ reset: true });
      assert.equal(report.steps, length, `epoch ${e}`);
      const f = report.firstNonFinite;
      const expected = firstOverflow && [firstOverflow[0], "backward", firstOverflow[1]];
      assert.deepEqual(f && [f.step, f.phase, f.scale], expected, `epoch ${e}: first overflow`);
    }
    assert.equal(ref.skippedSteps, 3, "the plan skips three effective batches");
    trainer.dispose();
    inspector.dispose();
    model.dispose();
  },
});
