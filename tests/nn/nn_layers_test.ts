import assert from "node:assert/strict";
import { backward, embedding, noGrad, sum, Tensor, tidy } from "../../gpu/mod.ts";
import { dropout } from "../../gpu/mod.ts";
import { randomUniform } from "../../gpu/mod.ts";
import { RandomGenerator } from "../../gpu/mod.ts";
import {
  crossEntropy,
  Dropout,
  Embedding,
  Flatten,
  Linear,
  MaxPool2d,
  mseLoss,
  ReLU,
  Sequential,
} from "../../nn/mod.ts";
import { SGD } from "../../optim/mod.ts";
import { GPU_TEST, withEachRowLayout } from "../helpers/gpu.ts";
import { gradcheck } from "../helpers/gradcheck.ts";
import { crossEntropy64, matmul64, quantize, uniform } from "../helpers/reference.ts";
import { assertClose, TOL } from "../helpers/assert.ts";

Deno.test("random: a generator is reproducible, never straddles keys, and saves its state", () => {
  const a = new RandomGenerator(5), b = new RandomGenerator(5);
  assert.deepEqual(a.uniform(10), b.uniform(10));
  assert.notDeepEqual(new RandomGenerator(6).uniform(10), new RandomGenerator(5).uniform(10));
  const c = new RandomGenerator(1, 2 ** 32 - 3);
  const r = c.take(10);
  assert.equal(r.counter, 0, "a block that would cross 2^32 starts on the next key");
  assert.deepEqual(c.state(), { seed: 1, offset: 2 ** 32 + 10 });
  const u = new RandomGenerator(9).uniform(20000);
  const meanU = u.reduce((s, v) => s + v, 0) / u.length;
  assert.ok(Math.abs(meanU - 0.5) < 0.01, `uniform mean ${meanU}`);
  const n = new RandomGenerator(9).normal(20000);
  const meanN = n.reduce((s, v) => s + v, 0) / n.length;
  const varN = n.reduce((s, v) => s + (v - meanN) ** 2, 0) / n.length;
  assert.ok(Math.abs(meanN) < 0.03 && Math.abs(varN - 1) < 0.05, `normal ${meanN} ${varN}`);
  assert.throws(
    () => new RandomGenerator(-1),
    /seed \(-1\) and offset \(0\) must be non-negative integers/,
  );
});

Deno.test({
  name:
    "dropout: the GPU mask is the CPU generator's, regenerated exactly in backward, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const dtype of ["f32", "f16", "bf16"] as const) {
      const n = 5003, p = 0.3;
      const x = quantize(uniform(n, 1, 0.5, 2), dtype); // no zeros: a zero output means dropped
      const range = new RandomGenerator(11, 12345).take(n);
      const tx = Tensor.from(x, [n], { dtype, requiresGrad: true });
      const y = dropout(tx, p, range);
      const expected = x.map((
        v,
        i,
      ) => (randomUniform(range.key, range.counter + i) >= p ? v / (1 - p) : 0));
      assertClose(await y.read(), expected, TOL[dtype], `dropout ${dtype}`);
      const dropped = expected.filter((v) => v === 0).length / n;
      assert.ok(Math.abs(dropped - p) < 0.03, `dropped fraction ${dropped}`);
      y.backward({ gradient: Tensor.full([n], 1, { dtype }) });
      const g = await tx.grad!.read();
      expected.forEach((v, i) => assert.equal(g[i] === 0, v === 0, `mask differs at ${i}`));
    }
  },
});

Deno.test({
  name: "Dropout layer: training draws fresh masks, eval passes through",
  ...GPU_TEST,
  async fn() {
    const layer = new Dropout(0.5, { seed: 3 });
    const x = Tensor.full([1000], 1);
    const a = await layer.forward(x).read(), b = await layer.forward(x).read();
    assert.notDeepEqual(a, b, "two forwards draw two masks");
    layer.eval();
    assert.equal(layer.forward(x), x);
    assert.throws(() => new Dropout(1), /Dropout: p must be in \[0, 1\), got 1/);
  },
});

Deno.test({
  name: "Linear: seeded PyTorch-style init, and forward against f64",
  ...GPU_TEST,
  async fn() {
    const layer = new Linear(37, 11, { seed: 4 });
    const w = Float64Array.from(await layer.weight.read()),
      b = Float64Array.from(await layer.bias!.read());
    const bound = 1 / Math.sqrt(37);
    assert.ok(w.every((v) => Math.abs(v) <= bound) && b.every((v) => Math.abs(v) <= bound));
    assert.ok(Math.max(...w) > 0.9 * bound && Math.min(...w) < -0.9 * bound, "spans the range");
    assert.deepEqual(
      await new Linear(37, 11, { seed: 4 }).weight.read(),
      await layer.weight.read(),
    );
    const x = uniform(5 * 37, 1);
    const y = layer.forward(Tensor.from(x, [5, 37]));
    const ref = matmul64(x, w, { batch: 1, m: 5, n: 11, k: 37, transA: false, transB: true })
      .map((v, i) => v + b[i % 11]);
    assertClose(await y.read(), ref, TOL.f32, "Linear forward");
  },
});

Deno.test({
  name: "Module: dotted names, train/eval, and stateDict round trips; mismatches reported together",
  ...GPU_TEST,
  async fn() {
    const make = (seed: number) =>
      new Sequential(
        new Linear(4, 8, { seed }),
        new ReLU(),
        new Dropout(0.1),
        new Linear(8, 3, { seed: seed + 1 }),
      );
    const model = make(1);
    assert.deepEqual(model.namedParameters().map(([n]) => n), [
      "0.weight",
      "0.bias",
      "3.weight",
      "3.bias",
    ]);
    model.eval();
    assert.ok(model.layers.every((l) => !l.training));
    const other = make(2);
    other.loadStateDict(model.stateDict());
    for (const [name, t] of other.stateDict()) {
      assert.deepEqual(await t.read(), await model.stateDict().get(name)!.read(), name);
    }
    const before = await other.layers[0].parameters()[0].read();
    const bad = new Map(model.stateDict());
    bad.delete("3.bias");
    bad.set("0.weight", Tensor.zeros([8, 5]));
    bad.set("extra", Tensor.zeros([1]));
    assert.throws(
      () => other.loadStateDict(bad),
      (e: Error) =>
        /nothing was changed/.test(e.message) && /missing 3\.bias/.test(e.message) &&
        /unexpected extra/.test(e.message) &&
        /0\.weight: expected f32 \[8, 4\], got f32 \[8, 5\]/.test(e.message),
    );
    assert.deepEqual(
      await other.layers[0].parameters()[0].read(),
      before,
      "unchanged after a failed load",
    );
  },
});

Deno.test({
  name:
    "Embedding: lookup and scatter-add gradient with repeated ids, f32, f16 and bf16; bad ids are clear errors",
  ...GPU_TEST,
  async fn() {
    for (const dtype of ["f32", "f16", "bf16"] as const) {
      const emb = new Embedding(7, 5, { seed: 2, dtype });
      const table = await emb.weight.read();
      const ids = [3, 0, 3, 6, 3, 1];
      const out = emb.forward(Tensor.from(ids, [2, 3], { dtype: "i32" }));
      assert.deepEqual(out.shape, [2, 3, 5]);
      assert.equal(out.dtype, dtype);
      const expected = ids.flatMap((id) => Array.from(table.slice(id * 5, id * 5 + 5)));
      assertClose(await out.read(), expected, { atol: 0, rtol: 0 }, `gather ${dtype}`);
      const g = quantize(uniform(6 * 5, 4), dtype);
      out.backward({ gradient: Tensor.from(g, [2, 3, 5], { dtype }) });
      const dw = new Float64Array(35);
      ids.forEach((id, r) => {
        for (let d = 0; d < 5; d++) dw[id * 5 + d] += g[r * 5 + d];
      });
      // f16: up to three f16 terms summed in f32, then rounded once to f16.
      assertClose(await emb.weight.grad!.read(), dw, TOL[dtype], `scatter-add ${dtype}`);
      assert.throws(
        () => emb.forward(Tensor.from([0, 7], [2], { dtype: "i32" })),
        /embedding: ids i32 \[2\] range over \[0, 7\] but must lie in \[0, 6\]/,
      );
      assert.throws(
        () => emb.forward(Tensor.from([0, 1], [2])),
        /needs a table \[vocab, dim\] and i32 ids/,
      );
      emb.dispose();
    }
  },
});

Deno.test({
  name: "crossEntropy: losses and gradients match f64 with smoothing, class weights and " +
    "ignored rows, for every reduction, f32 and f16 logits, odd shapes",
  ...GPU_TEST,
  async fn() {
    await withEachRowLayout(async () => {
      // 300 classes: more than one pass of the 256-thread row reduction.
      for (const [rows, classes] of [[9, 13], [5, 300], [1, 1]]) {
        const targets = Array.from({ length: rows }, (_, i) => (i * 5) % classes);
        if (rows > 2) targets[2] = -100; // ignored
        const weight = Array.from(uniform(classes, 7, 0.2, 3));
        for (const dtype of ["f32", "f16"] as const) {
          for (const eps of [0, 0.1]) {
            for (const weighted of [false, true]) {
              for (const reduction of ["mean", "sum", "none"] as const) {
                const x = quantize(uniform(rows * classes, 3, -8, 8), dtype);
                const options = { smoothing: eps, weight: weighted ? weight : null, reduction };
                const ref = crossEntropy64(x, targets, classes, options);
                const tx = Tensor.from(x, [rows, classes], { dtype, requiresGrad: true });
                const loss = crossEntropy(tx, targets, {
                  reduction,
                  labelSmoothing: eps,
                  ...(weighted && { weight }),
                });
                assert.equal(loss.dtype, "f32", "losses are f32");
                const label =
                  `${rows}×${classes} ${dtype} ε=${eps} weighted=${weighted} ${reduction}`;
                assertClose(await loss.read(), ref.loss, TOL.f32, label);
                backward(loss, reduction === "none" ? { gradient: Tensor.full([rows], 1) } : {});
                assertClose(await tx.grad!.read(), ref.grad, TOL[dtype], `${label} grad`);
              }
            }
          }
        }
      }
    });
  },
});

Deno.test({
  name: "crossEntropy: every row ignored gives a NaN mean, a zero sum and a zero gradient",
  ...GPU_TEST,
  async fn() {
    const x = Tensor.from(uniform(8, 1), [2, 4], { requiresGrad: true });
    const [mean] = await crossEntropy(x, [-100, -100]).read();
    assert.ok(Number.isNaN(mean), "PyTorch's mean over no kept rows is NaN");
    const total = crossEntropy(x, [-1, -1], { ignoreIndex: -1, reduction: "sum" });
    assert.equal(await total.item(), 0);
    backward(total);
    assert.deepEqual(Array.from(await x.grad!.read()), new Array(8).fill(0));
    // An ignore index inside [0, classes) ignores that class's rows only.
    const some = crossEntropy(x, [3, 1], { ignoreIndex: 3, reduction: "none" });
    const [first, second] = await some.read();
    assert.equal(first, 0);
    assert.ok(second > 0);
  },
});

Deno.test({
  name: "crossEntropy and mseLoss: finite differences; bad targets are clear errors",
  ...GPU_TEST,
  async fn() {
    await gradcheck(
      "crossEntropy",
      ([x]) => crossEntropy(x, [1, 0, 3], { labelSmoothing: 0.2 }),
      [uniform(12, 1, -2, 2)],
      [[3, 4]],
    );
    await gradcheck(
      "crossEntropy weighted, ignored row",
      ([x]) => crossEntropy(x, [1, -100, 3], { labelSmoothing: 0.2, weight: [0.5, 2, 1, 3] }),
      [uniform(12, 4, -2, 2)],
      [[3, 4]],
    );
    await gradcheck("mseLoss", ([a, b]) => mseLoss(a, b), [uniform(10, 2), uniform(10, 3)], [
      [2, 5],
      [2, 5],
    ]);
    tidy(() => {
      const x = Tensor.zeros([3, 4]);
      assert.throws(
        () => crossEntropy(x, [0, 4, 1]),
        /crossEntropy: ids i32 \[3\] range over \[0, 4\] but must lie in \[0, 3\]/,
      );
      assert.throws(
        () => crossEntropy(x, [0, 1]),
        /needs logits \[rows, classes\] and i32 targets \[rows\]/,
      );
      assert.throws(() => crossEntropy(x, [0, 1.5, 2]), /element 1 \(1\.5\) of an i32 tensor/);
      assert.throws(
        () => crossEntropy(x, [-100, -5, 1]),
        /range over \[-5, 1\] but must lie in \[0, 3\] \(or be the ignore index -100\)/,
      );
      assert.throws(
        () => crossEntropy(x, [0, 1, 2], { weight: [1, 2, 3] }),
        /crossEntropy: class weights must be f32 \[4\]/,
      );
      assert.throws(
        () => crossEntropy(x, [0, 1, 2], { labelSmoothing: 1.5 }),
        /label smoothing must be in \[0, 1\], got 1\.5/,
      );
      assert.throws(
        () => crossEntropy(x, [0, 1, 2], { reduction: "avg" as "mean" }),
        /reduction must be "mean", "sum" or "none"/,
      );
    });
  },
});

Deno.test({
  name: "mseLoss: matches f64 with f16 inputs, in f32",
  ...GPU_TEST,
  async fn() {
    const a = quantize(uniform(33, 1), "f16"), b = quantize(uniform(33, 2), "f16");
    const loss = mseLoss(
      Tensor.from(a, [33], { dtype: "f16" }),
      Tensor.from(b, [33], { dtype: "f16" }),
    );
    assert.equal(loss.dtype, "f32");
    const ref = a.reduce((s, v, i) => s + (v - b[i]) ** 2, 0) / 33;
    assertClose(await loss.read(), [ref], TOL.f32, "mse");
  },
});

Deno.test({
  name: "an MLP (Linear/ReLU/Linear) trains on a synthetic task with plain SGD",
  ...GPU_TEST,
  async fn() {
    // Two classes split by a circle: not linearly separable, so the hidden layer must learn.
    const n = 256, r = new RandomGenerator(21).uniform(2 * n, -1, 1);
    const labels = Array.from(
      { length: n },
      (_, i) => (r[2 * i] ** 2 + r[2 * i + 1] ** 2 < 0.5 ? 1 : 0),
    );
    const x = Tensor.from(r, [n, 2]);
    const model = new Sequential(
      new Linear(2, 32, { seed: 1 }),
      new ReLU(),
      new Linear(32, 2, { seed: 2 }),
    );
    const opt = new SGD(model.parameters(), { lr: 0.5 });
    const lossAt = () => tidy(() => crossEntropy(model.forward(x), labels));
    const first = await noGrad(lossAt).item();
    for (let step = 0; step < 300; step++) {
      const loss = lossAt();
      loss.backward();
      loss.dispose();
      opt.step();
      opt.zeroGrad();
    }
    const last = await noGrad(lossAt).item();
    assert.ok(first > 0.6, `starts near log 2 (${first})`);
    assert.ok(last < 0.25, `trained loss ${last} (from ${first})`);
  },
});

Deno.test({
  name: "SGD with momentum follows v = m·v + g, p = p − lr·v (f64 reference, 3 steps)",
  ...GPU_TEST,
  async fn() {
    const p0 = uniform(7, 1), grads = [uniform(7, 2), uniform(7, 3), uniform(7, 4)];
    const p = Tensor.from(p0, [7], { requiresGrad: true });
    const opt = new SGD([p], { lr: 0.1, momentum: 0.9 });
    const ref = Float64Array.from(p0), v = new Float64Array(7);
    for (const g of grads) {
      p.grad = Tensor.from(g, [7]);
      opt.step();
      opt.zeroGrad();
      g.forEach((gi, i) => {
        v[i] = 0.9 * v[i] + gi;
        ref[i] -= 0.1 * v[i];
      });
    }
    assertClose(await p.read(), ref, TOL.f32, "momentum SGD");
    assert.throws(() => new SGD([p], { lr: 0.1, momentum: 1 }), /momentum must be in \[0, 1\)/);
    opt.dispose();
  },
});

Deno.test({
  name: "embedding: the gradient counts every one of 70001 ids (summed in passes on lavapipe)",
  ...GPU_TEST,
  async fn() {
    const n = 70001, vocab = 5, dim = 3;
    const table = Tensor.zeros([vocab, dim], { requiresGrad: true });
    const ids = Tensor.from(Array.from({ length: n }, (_, i) => (i * 7) % vocab), [n], {
      dtype: "i32",
    });
    backward(embedding(table, ids), { gradient: Tensor.full([n, dim], 1) });
    const counts = Array.from(
      { length: vocab },
      (_, v) =>
        Array.from({ length: n }, (_, i) => (i * 7) % vocab).filter((id) => id === v).length,
    );
    assert.deepEqual([...(await table.grad!.read())], counts.flatMap((c) => [c, c, c]));
    table.dispose();
    ids.dispose();
  },
});

Deno.test({
  name: "Sequential: an intermediate no op saved is freed as soon as the next layer has run",
  ...GPU_TEST,
  async fn() {
    // ReLU's output feeds max pooling, which keeps only its argmax indices.
    const model = new Sequential(new ReLU(), new MaxPool2d(2), new Flatten());
    const x = Tensor.from(uniform(2 * 4 * 8 * 8, 3), [2, 4, 8, 8], { requiresGrad: true });
    const gpu = x.gpu;
    const before = gpu.memoryStats().allocatedBytes;
    const y = model.forward(x);
    const held = gpu.memoryStats().allocatedBytes - before;
    // The pooled output (shared by Flatten) and its i32 indices, 512 bytes each; not ReLU's 2 KiB.
    assert.equal(held, 2 * 512, `${held} bytes held after forward`);
    const loss = sum(y);
    backward(loss);
    const grad = await x.grad!.read();
    assert.equal(grad.filter((v) => v !== 0).length > 0, true, "gradients reach the input");
    for (const t of [x, y, loss]) t.dispose();
  },
});
