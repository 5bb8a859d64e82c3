/**
 * Half-precision master gradients (apex O2, `AmpTrainer({ gradDtype })`):
 * the step they give equals the f32-gradient step within f16 rounding, both
 * against an f64 reference; unscale-before-clip holds although the gradients
 * stay scaled; an overflow in an f16 weight gradient skips the step and
 * leaves everything bit-identical; accumulation keeps f32 and equals a big
 * batch; the gradients really are 2 bytes an element and the step's peak
 * falls by about 2 bytes a parameter.
 */
import assert from "node:assert/strict";
import {
  AdamW,
  AmpTrainer,
  type AmpTrainerOptions,
  crossEntropy,
  dequantizeStates,
  DTypeError,
  GradScaler,
  Linear,
  RandomGenerator,
  ReLU,
  Sequential,
  SGD,
  StateError,
  Tensor,
} from "../../mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { assertClose, assertCloseScaled, TOL } from "../helpers/assert.ts";
import { quantize } from "../helpers/reference.ts";
import { Gpt } from "../../models/mod.ts";
import { gpt2Config } from "../../models/mod.ts";

const IN = 5, HIDDEN = 7, OUT = 3, ROWS = 9; // odd sizes: no tile or word boundary lines up

interface Net {
  model: Sequential;
  l1: Linear;
  l2: Linear;
}

function net(seed: number): Net {
  const rng = new RandomGenerator(seed);
  const l1 = new Linear(IN, HIDDEN, { seed: rng }), l2 = new Linear(HIDDEN, OUT, { seed: rng });
  return { model: new Sequential(l1, new ReLU(), l2), l1, l2 };
}

function data(seed: number, rows = ROWS, amplitude = 1): { x: Float32Array; labels: number[] } {
  const x = new RandomGenerator(seed).uniform(rows * IN, -amplitude, amplitude);
  const labels = Array.from({ length: rows }, (_, r) => (r * 5 + seed) % OUT);
  return { x, labels };
}

/** [W1, b1, W2, b2] of `n` as host arrays. */
async function weights(n: Net): Promise<Float64Array[]> {
  const ts = [n.l1.weight, n.l1.bias!, n.l2.weight, n.l2.bias!];
  return await Promise.all(ts.map(async (t) => Float64Array.from(await t.read())));
}

/**
 * f64 gradients (with Σ|term| of each element: its rounding scale) of mean cross-entropy of Linear → ReLU → Linear, from the
 * f16 working copies of the weights and the f16 input (as autocast reads
 * them), the hidden rows and logits rounded to f16 where the kernels store them.
 */
function referenceTerms(
  w: Float64Array[],
  x: Float32Array,
  labels: number[],
): { grads: Float64Array[]; magnitudes: Float64Array[] } {
  const [w1, b1, w2, b2] = [quantize(w[0], "f16"), w[1], quantize(w[2], "f16"), w[3]];
  const xq = quantize(x, "f16"), rows = labels.length;
  const h = new Float64Array(rows * HIDDEN), dlogits = new Float64Array(rows * OUT);
  for (let r = 0; r < rows; r++) {
    for (let j = 0; j < HIDDEN; j++) {
      let s = b1[j];
      for (let i = 0; i < IN; i++) s += xq[r * IN + i] * w1[j * IN + i];
      h[r * HIDDEN + j] = Math.max(0, s);
    }
  }
  const hq = quantize(h, "f16");
  for (let r = 0; r < rows; r++) {
    const logits = Array.from({ length: OUT }, (_, o) => {
      let s = b2[o];
      for (let j = 0; j < HIDDEN; j++) s += hq[r * HIDDEN + j] * w2[o * HIDDEN + j];
      return s;
    });
    const lq = quantize(logits, "f16");
    const m = Math.max(...lq), z = lq.reduce((a, v) => a + Math.exp(v - m), 0);
    for (let o = 0; o < OUT; o++) {
      dlogits[r * OUT + o] = (Math.exp(lq[o] - m) / z - (o === labels[r] ? 1 : 0)) / rows;
    }
  }
  const g = [w1, b1, w2, b2].map((t) => new Float64Array(t.length));
  const m = [w1, b1, w2, b2].map((t) => new Float64Array(t.length));
  const add = (k: number, i: number, v: number, size: number) => {
    g[k][i] += v;
    m[k][i] += size;
  };
  for (let r = 0; r < rows; r++) {
    for (let o = 0; o < OUT; o++) {
      const d = dlogits[r * OUT + o];
      add(3, o, d, Math.abs(d));
      for (let j = 0; j < HIDDEN; j++) {
        add(2, o * HIDDEN + j, d * hq[r * HIDDEN + j], Math.abs(d * hq[r * HIDDEN + j]));
      }
    }
    for (let j = 0; j < HIDDEN; j++) {
      if (h[r * HIDDEN + j] <= 0) continue;
      let dh = 0, dhSize = 0;
      for (let o = 0; o < OUT; o++) {
        dh += dlogits[r * OUT + o] * w2[o * HIDDEN + j];
        dhSize += Math.abs(dlogits[r * OUT + o] * w2[o * HIDDEN + j]);
      }
      add(1, j, dh, dhSize);
      for (let i = 0; i < IN; i++) {
        add(0, j * IN + i, dh * xq[r * IN + i], dhSize * Math.abs(xq[r * IN + i]));
      }
    }
  }
  return { grads: g, magnitudes: m };
}

function step(trainer: AmpTrainer, n: Net, b: { x: Float32Array; labels: number[] }): void {
  const rows = b.labels.length;
  trainer.step(() => crossEntropy(n.model.forward(Tensor.from(b.x, [rows, IN])), b.labels))
    .dispose();
}

/** One SGD (lr 1) step of a fresh net under `options`: what it subtracted from each weight. */
async function sgdUpdate(options: AmpTrainerOptions, b = data(3)): Promise<{
  before: Float64Array[];
  update: Float64Array[];
  trainer: AmpTrainer;
}> {
  const n = net(1);
  const trainer = new AmpTrainer(n.model, new SGD(n.model.parameters(), { lr: 1 }), options);
  const before = await weights(n);
  step(trainer, n, b);
  const after = await weights(n);
  trainer.dispose();
  return { before, update: before.map((w, k) => w.map((v, i) => v - after[k][i])), trainer };
}

const NAMES = ["W1", "b1", "W2", "b2"];

Deno.test({
  name: "f16 gradients: the fused unscale-and-update equals the f32-gradient step, both vs f64",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    const b = data(3);
    const f32 = await sgdUpdate({}, b), f16 = await sgdUpdate({ gradDtype: "f16" }, b);
    assert.equal(f16.trainer.gradDtype, "f16");
    assert.equal(f32.trainer.gradDtype, "f32");
    const { grads: ref, magnitudes } = referenceTerms(f16.before, b.x, b.labels);
    for (let k = 0; k < 4; k++) {
      // Both paths hold f16 activations and an f16 logits' gradient: errors of 2^-11 of the
      // terms each element sums (magnitudes), as a bias's gradient cancels to far less;
      // f16 gradients add one rounding (2^-11 of the result) more.
      const at = { magnitudes: magnitudes[k] };
      assertCloseScaled(f32.update[k], ref[k], TOL.f16, `f32-gradient ${NAMES[k]}`, at);
      assertCloseScaled(f16.update[k], ref[k], TOL.f16, `f16-gradient ${NAMES[k]}`, at);
      assertCloseScaled(f16.update[k], f32.update[k], TOL.f16, `f16 vs f32 ${NAMES[k]}`, at);
    }
    // Not a no-op: the step moved every weight matrix.
    for (const k of [0, 2]) assert.ok(f16.update[k].some((v) => Math.abs(v) > 1e-3));
  },
});

Deno.test({
  name: "f16 gradients: clipping sees the unscaled norm although the gradients stay scaled",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    const b = data(4);
    const free = await sgdUpdate({ gradDtype: "f16" }, b);
    const { grads: ref, magnitudes } = referenceTerms(free.before, b.x, b.labels);
    const norm = Math.sqrt(ref.reduce((a, g) => a + g.reduce((s, v) => s + v * v, 0), 0));
    // Clip to a third of the true norm: a norm taken of the scaled gradients (2^16 times
    // larger) would scale the step by ~2^-16 / 3 instead of 1/3.
    const maxGradNorm = norm / 3;
    const clipped = await sgdUpdate({ gradDtype: "f16", maxGradNorm }, b);
    const f32Clipped = await sgdUpdate({ maxGradNorm }, b);
    const coef = maxGradNorm / (norm + 1e-6);
    for (let k = 0; k < 4; k++) {
      const expected = ref[k].map((v) => v * coef);
      const at = { magnitudes: magnitudes[k].map((v) => v * coef) };
      assertCloseScaled(clipped.update[k], expected, TOL.f16, `clipped f16 ${NAMES[k]}`, at);
      assertCloseScaled(f32Clipped.update[k], expected, TOL.f16, `clipped f32 ${NAMES[k]}`, at);
    }
  },
});

async function raw(ts: Tensor[]): Promise<(Float32Array | Int32Array)[]> {
  return await Promise.all(ts.map((t) => t.read()));
}

Deno.test({
  name: "f16 gradients: an overflow in a weight gradient alone skips the step, all bit-identical",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    // Inputs of ±300: the logits' gradients (× 2^16 / 9 rows) and the inputs' stay in f16's
    // range, but W1's and W2's gradients (sums over rows of gradient × activation) do not.
    const big = data(5, ROWS, 300);
    const run = (gradDtype: "f16" | "f32") => {
      const n = net(2);
      const optimizer = new AdamW(n.model.parameters(), { lr: 1e-2, stateDtype: "8bit" });
      const trainer = new AmpTrainer(n.model, optimizer, { gradDtype, maxGradNorm: 1 });
      return { n, optimizer, trainer };
    };
    const f16 = run("f16");
    step(f16.trainer, f16.n, data(6)); // a clean step first: moments and copies are not zero
    assert.equal(await f16.trainer.scaler.lastStepSkipped(), false);
    const params = f16.n.model.parameters();
    const copies = params.map((p) => f16.trainer.masters!.copyOf(p)!);
    const masters = await raw(params), copyBits = await raw(copies);
    const state = await f16.optimizer.stateDict();
    step(f16.trainer, f16.n, big);
    assert.equal(await f16.trainer.scaler.lastStepSkipped(), true, "the f16 step is skipped");
    assert.equal(await f16.trainer.scaler.getScale(), 2 ** 15, "the scale backs off");
    assert.deepEqual(await raw(params), masters);
    assert.deepEqual(await raw(copies), copyBits);
    assert.deepEqual(await f16.optimizer.stateDict(), state);
    step(f16.trainer, f16.n, data(7)); // the next clean step applies
    assert.equal(await f16.trainer.scaler.lastStepSkipped(), false);
    assert.notDeepEqual(await raw(params), masters);
    f16.trainer.dispose();
    // The same batch in f32 gradients is finite: the overflow was the f16 weight gradient's.
    const f32 = run("f32");
    step(f32.trainer, f32.n, data(6));
    step(f32.trainer, f32.n, big);
    assert.equal(await f32.trainer.scaler.lastStepSkipped(), false);
    f32.trainer.dispose();
  },
});

Deno.test({
  name: "f16 gradients: accumulation keeps f32 master gradients and equals one big batch",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    const b = data(8, 2 * ROWS);
    const half = (h: 0 | 1) => ({
      x: b.x.slice(h * ROWS * IN, (h + 1) * ROWS * IN),
      labels: b.labels.slice(h * ROWS, (h + 1) * ROWS),
    });
    const n = net(1);
    const trainer = new AmpTrainer(n.model, new SGD(n.model.parameters(), { lr: 1 }), {
      gradDtype: "f16",
      accumulationSteps: 2,
    });
    assert.equal(trainer.gradDtype, "f32", "accumulated over 2 micro-batches in f32");
    const before = await weights(n);
    step(trainer, n, half(0));
    for (const p of n.model.parameters()) assert.equal(p.grad!.dtype, "f32");
    step(trainer, n, half(1));
    const after = await weights(n);
    trainer.dispose();
    const accumulated = before.map((w, k) => w.map((v, i) => v - after[k][i]));
    const big = await sgdUpdate({}, b), bigHalf = await sgdUpdate({ gradDtype: "f16" }, b);
    const { grads: ref, magnitudes } = referenceTerms(before, b.x, b.labels);
    for (let k = 0; k < 4; k++) {
      const at = { magnitudes: magnitudes[k] };
      // Same f16 rows, same f32 sums, only in another order: f32 rounding apart.
      assertCloseScaled(
        accumulated[k],
        big.update[k],
        TOL.f32,
        `accumulated vs big ${NAMES[k]}`,
        at,
      );
      assertCloseScaled(accumulated[k], bigHalf.update[k], TOL.f16, `vs f16 big ${NAMES[k]}`, at);
      assertCloseScaled(accumulated[k], ref[k], TOL.f16, `accumulated vs f64 ${NAMES[k]}`, at);
    }
  },
});

Deno.test({
  name: "f16 gradients: every master's gradient is f16, 2 bytes an element",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    const n = net(1);
    const params = n.model.parameters();
    const trainer = new AmpTrainer(n.model, new SGD(params, { lr: 1 }), { gradDtype: "f16" });
    const b = data(9);
    const loss = trainer.autocast(() =>
      crossEntropy(n.model.forward(Tensor.from(b.x, [ROWS, IN])), b.labels)
    );
    trainer.scaler.scale(loss).backward();
    loss.dispose();
    for (const p of params) {
      assert.equal(p.gradDtype, "f16");
      assert.equal(p.grad!.dtype, "f16", `gradient of ${p.describe()}`);
    }
    // Still scaled (by 2^16): the deferred unscale happens in the fused update.
    const { grads: ref, magnitudes } = referenceTerms(await weights(n), b.x, b.labels);
    const g = await params[2].grad!.read();
    assertCloseScaled(Array.from(g, (v) => v / 2 ** 16), ref[2], TOL.f16, "scaled W2 gradient", {
      magnitudes: magnitudes[2],
    });
    n.model.zeroGrad();
    trainer.dispose();
    assert.equal(params[0].gradDtype, null, "dispose gives the masters back their f32 gradients");
    // The buffer holds 2 bytes an element: a 301 × 301 weight's is under an f32 one's 4.
    const wide = new Linear(301, 301, { seed: 5 });
    const wideTrainer = new AmpTrainer(wide, new SGD(wide.parameters(), { lr: 1 }), {
      gradDtype: "f16",
    });
    const x = Tensor.from(new RandomGenerator(6).uniform(2 * 301, -1, 1), [2, 301]);
    const wideLoss = wideTrainer.autocast(() => crossEntropy(wide.forward(x), [3, 300]));
    wideTrainer.scaler.scale(wideLoss).backward();
    wideLoss.dispose();
    const bytes = wide.weight.grad!.buffer.size;
    assert.ok(bytes >= 2 * 301 * 301 && bytes < 4 * 301 * 301, `${bytes} B of gradient`);
    wide.zeroGrad();
    wideTrainer.dispose();
    x.dispose();
  },
});

/** The pool's peak over one AMP step of a wide MLP (its gradients dominate the activations). */
async function peakOfStep(gradDtype: "f16" | "f32", width: number): Promise<number> {
  const rng = new RandomGenerator(3);
  const model = new Sequential(
    new Linear(width, width, { seed: rng }),
    new ReLU(),
    new Linear(width, width, { seed: rng }),
  );
  const trainer = new AmpTrainer(model, new AdamW(model.parameters(), { stateDtype: "8bit" }), {
    gradDtype,
    maxGradNorm: 1,
  });
  const x = Tensor.from(new RandomGenerator(4).uniform(3 * width, -1, 1), [3, width]);
  await gpu.sync();
  gpu.resetPeakMemory();
  const base = gpu.memoryStats().allocatedBytes;
  trainer.step(() => crossEntropy(model.forward(x), [0, 1, 2])).dispose();
  const peak = gpu.memoryStats().peakBytes - base;
  trainer.dispose();
  x.dispose();
  for (const p of model.parameters()) p.dispose();
  return peak;
}

Deno.test({
  name: "f16 gradients: a step's peak falls by about 2 bytes a parameter",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    const width = 301, params = 2 * (width * width + width);
    const f32 = await peakOfStep("f32", width), f16 = await peakOfStep("f16", width);
    const saved = f32 - f16;
    // f32 gradients are 4 bytes a parameter, f16 ones 2: about 2 bytes a parameter less
    // (pool size classes round each buffer up, hence the range).
    assert.ok(saved >= 1.5 * params, `saved ${saved} B of ${f32} for ${params} parameters`);
    assert.ok(saved <= 3 * params, `saved ${saved} B of ${f32} for ${params} parameters`);
  },
});

Deno.test({
  name:
    "bf16 gradients under bf16 AMP: bf16 bytes, the step as the f32-gradient one within bf16 rounding",
  ...GPU_TEST,
  async fn() {
    const b = data(10);
    const bf16 = await sgdUpdate({ dtype: "bf16", gradDtype: "bf16" }, b);
    assert.equal(bf16.trainer.gradDtype, "bf16");
    assert.ok(!bf16.trainer.scaler.enabled);
    const f32 = await sgdUpdate({ dtype: "bf16" }, b);
    for (let k = 0; k < 4; k++) {
      // bf16 activations on both sides; bf16 gradients add one rounding (2^-8 relative).
      assertCloseScaled(bf16.update[k], f32.update[k], TOL.bf16, `bf16 vs f32 ${NAMES[k]}`);
    }
    const n = net(1);
    const trainer = new AmpTrainer(n.model, new SGD(n.model.parameters(), { lr: 1 }), {
      dtype: "bf16",
      gradDtype: "bf16",
    });
    const loss = trainer.autocast(() =>
      crossEntropy(n.model.forward(Tensor.from(b.x, [ROWS, IN])), b.labels)
    );
    loss.backward();
    loss.dispose();
    for (const p of n.model.parameters()) assert.equal(p.grad!.dtype, "bf16");
    n.model.zeroGrad();
    trainer.dispose();
  },
});

Deno.test({
  name: "f16 gradients: Adam with f32, bf16 and 8-bit states reads them as the f32 ones",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    const b = data(11);
    for (const stateDtype of ["f32", "bf16", "8bit"] as const) {
      const updates = [], moments: unknown[][] = [];
      for (const gradDtype of ["f32", "f16"] as const) {
        const n = net(1);
        // min8bitSize 0: these small tensors in 8 bits too (the compact kernel, not f32's).
        const opt = new AdamW(n.model.parameters(), {
          lr: 1e-2,
          stateDtype,
          ...(stateDtype === "8bit" ? { min8bitSize: 0 } : {}),
        });
        const trainer = new AmpTrainer(n.model, opt, { gradDtype });
        const before = await weights(n);
        step(trainer, n, b);
        const after = await weights(n);
        // The first moment is 0.1 × the unscaled gradient: 2^16 times larger if the kernel
        // forgot the deferred 1/scale (the update itself, m/√v, would not show it).
        moments.push(dequantizeStates(await opt.stateDict()).state.map((s) => s.buffers.expAvg));
        trainer.dispose();
        updates.push(before.map((w, k) => w.map((v, i) => (v - after[k][i]) / 1e-2)));
      }
      moments[0].forEach((m32, k) => {
        const m16 = moments[1][k] as Float32Array, expected = m32 as Float32Array;
        const largest = expected.reduce((a, v) => Math.max(a, Math.abs(v)), 0);
        // 8-bit codes are ~1% apart near a block's largest value: 2% of it.
        assertClose(m16, expected, { atol: 0.02 * largest, rtol: 0.02 }, `${stateDtype} m ${k}`);
      });
      // Adam's first step is about ±lr an element whatever the gradient's size: an f16
      // gradient's rounding (2^-11 relative) moves it by far less than 1% of lr.
      for (let k = 0; k < 4; k++) {
        assertClose(updates[1][k], updates[0][k], { atol: 1e-2, rtol: 0 }, `${stateDtype} ${k}`);
        assert.ok(updates[1][k].some((v) => Math.abs(v) > 0.5), `${stateDtype} ${k} moved`);
      }
    }
  },
});

Deno.test({
  name: "f16 gradients in a GPT-2-shaped model (tied table in two pieces, its gradient summed " +
    "over chunks of rows and from the embedding): the step equals the f32-gradient one",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    const sizes = { vocab: 97, context: 16, layers: 2, dim: 24, heads: 3 };
    const ids = Array.from({ length: 3 * 13 }, (_, i) => (i * 31 + 7) % sizes.vocab);
    const updates: Float64Array[][] = [];
    for (const gradDtype of ["f32", "f16"] as const) {
      // Buffers of at most half the table: the table is kept in two column pieces.
      const model = new Gpt(gpt2Config(sizes, 3, (4 * sizes.vocab * sizes.dim) / 2));
      assert.equal(model.config.tableShards, 2);
      const params = model.parameters();
      const trainer = new AmpTrainer(model, new SGD(params, { lr: 1 }), { gradDtype });
      const before = await Promise.all(params.map(async (p) => Float64Array.from(await p.read())));
      const x = Tensor.from(ids, [3, 13], { dtype: "i32" });
      // 5 rows a chunk: the table's gradient is summed over 8 chunks.
      trainer.step(() => model.loss(x, ids.map((id) => (id + 1) % sizes.vocab), { chunkRows: 5 }))
        .dispose();
      const after = await Promise.all(params.map((p) => p.read()));
      updates.push(before.map((w, k) => w.map((v, i) => v - after[k][i])));
      trainer.dispose();
      x.dispose();
      model.dispose();
    }
    updates[0].forEach((expected, k) => {
      // One more f16 rounding of each gradient (2^-11), at the scale of the tensor's largest.
      assertCloseScaled(updates[1][k], expected, TOL.f16, `parameter ${k}`);
      assert.ok(expected.some((v) => v !== 0), `parameter ${k} moved`);
    });
  },
});

Deno.test({
  name:
    "GradScaler.unscale check only: f16 gradients keep their bits; an inf at any index is found",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    // 7 elements: three whole u32 words and a last one whose high half is padding.
    for (const bad of [-1, 0, 3, 6]) {
      const p = Tensor.from([1, 2, 3, 4, 5, 6, 7], [7], { requiresGrad: true });
      const values = [0.5, -1, 2, 65504, -3, 1e-7, 7].map((v, i) => i === bad ? Infinity : v);
      p.grad = Tensor.from(values, [7], { dtype: "f16" });
      const scaler = new GradScaler();
      const opt = new SGD([p], { lr: 1 });
      const bits = await p.grad.read();
      scaler.unscale(opt, { inPlace: false });
      assert.deepEqual(await p.grad.read(), bits, "left scaled, bit for bit");
      assert.equal((await scaler.foundInf.read())[0], bad >= 0 ? 1 : 0, `inf at ${bad}`);
      assert.equal((await scaler.inverseScale.read())[0], 2 ** -16);
      scaler.step(opt);
      scaler.update();
      // A clean step applied g / scale (SGD, lr 1); a bad one changed nothing.
      const after = await p.read();
      if (bad < 0) {
        assertClose(
          after,
          [1, 2, 3, 4, 5, 6, 7].map((w, i) => w - values[i] / 2 ** 16),
          TOL.f32,
        );
      } else assert.deepEqual(Array.from(after), [1, 2, 3, 4, 5, 6, 7]);
      scaler.dispose();
      p.grad.dispose();
      p.dispose();
    }
  },
});

Deno.test({
  name: "f16 gradients: a captured step gives the bits of the uncaptured one, step after step",
  ignore: !gpu.f16,
  ...GPU_TEST,
  async fn() {
    const runs: (Float32Array | Int32Array)[][] = [];
    for (const captured of [false, true]) {
      const n = net(4);
      const optimizer = new AdamW(n.model.parameters(), { lr: 1e-2, stateDtype: "8bit" });
      const trainer = new AmpTrainer(n.model, optimizer, { gradDtype: "f16", maxGradNorm: 0.5 });
      const loss = (x: Tensor, y: Tensor) => crossEntropy(n.model.forward(x), y);
      const step = trainer.capture(loss);
      for (let i = 0; i < 5; i++) {
        const b = data(20 + i);
        const x = Tensor.from(b.x, [ROWS, IN]);
        const y = Tensor.from(b.labels, [ROWS], { dtype: "i32" });
        (captured ? step.run(x, y) : trainer.step(() => loss(x, y))).dispose();
        x.dispose();
        y.dispose();
      }
      if (captured) assert.ok(step.captured, "replayed");
      runs.push(await raw(n.model.parameters()));
      trainer.dispose();
    }
    assert.deepEqual(runs[1], runs[0]);
  },
});

Deno.test({
  name: "gradDtype: a dtype that is not the AMP one, and a deferred unscale misused, are refused",
  ...GPU_TEST,
  fn() {
    const n = net(1);
    const sgd = new SGD(n.model.parameters(), { lr: 1 });
    assert.throws(
      () => new AmpTrainer(n.model, sgd, { dtype: "bf16", gradDtype: "f16" }),
      (e: Error) =>
        e instanceof DTypeError && /AmpTrainer/.test(e.message) &&
        /gradDtype "f16"/.test(e.message) && /"bf16"/.test(e.message),
    );
    const w = Tensor.from([1, 2], [2], { requiresGrad: true });
    assert.throws(
      () => (w.gradDtype = "i32"),
      (e: Error) => e instanceof DTypeError && /Tensor\.gradDtype/.test(e.message),
    );
    w.dispose();
    const scaler = new GradScaler();
    assert.throws(() => scaler.inverseScale, StateError);
    scaler.dispose();
  },
});
