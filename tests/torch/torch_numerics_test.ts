/**
 * PyTorch's numerics where users rely on them, against what PyTorch itself
 * computed (`tests/fixtures/torch/numerics.json`, written by
 * `make_numerics.py` with torch 1.13): NaN goes through ReLU — alone, as a
 * layer and fused into a linear layer's epilogue — through GELU, max pooling
 * and the max reduction, as in PyTorch, instead of being hidden as 0 from the
 * loss scaler that looks for it; and reductions and losses over zero
 * elements give PyTorch's values.
 */
import assert from "node:assert/strict";
import {
  AmpTrainer,
  backward,
  conv2d,
  crossEntropy,
  dropout,
  type DType,
  gelu,
  GradScaler,
  Linear,
  linear,
  max,
  maxPool2d,
  mean,
  noGrad,
  RandomGenerator,
  ReLU,
  relu,
  SGD,
  sum,
  Tensor,
  tidy,
} from "../../mod.ts";
import { MATMUL_CANDIDATES } from "../../gpu/mod.ts";
import { gpu, GPU_TEST, withEachElementwiseWidth, withTiling } from "../helpers/gpu.ts";
import { capturedWarnings } from "../helpers/warnings.ts";

const FIXTURES = new URL("../fixtures/torch/", import.meta.url);
const torch = JSON.parse(await Deno.readTextFile(new URL("numerics.json", FIXTURES)));

/** The fixture's numbers, with "NaN" and "±Infinity" strings turned back into numbers. */
function numbers(values: (number | string)[]): number[] {
  return values.map(Number);
}

/**
 * Element by element: NaN where PyTorch has NaN, the same infinity, and
 * finite values within `tol` (relative); the sign of zero is not compared.
 */
function assertLikeTorch(got: ArrayLike<number>, want: number[], what: string, tol = 0): void {
  assert.equal(got.length, want.length, `${what}: length`);
  for (let i = 0; i < want.length; i++) {
    const g = got[i], w = want[i];
    const ok = Number.isNaN(w)
      ? Number.isNaN(g)
      : Number.isFinite(w)
      ? Math.abs(g - w) <= tol * Math.max(1, Math.abs(w))
      : g === w;
    assert.ok(ok, `${what}[${i}]: got ${g}, PyTorch gives ${w} (got ${Array.from(got)})`);
  }
}

const FLOATS: DType[] = gpu.f16 ? ["f32", "f16"] : ["f32"];

Deno.test({
  name: "numerics: relu(NaN) is NaN and its gradient passes, as in PyTorch (f32, f16, vec4)",
  ...GPU_TEST,
  async fn() {
    const input = numbers(torch.input);
    await withEachElementwiseWidth(async (vec4) => {
      for (const dtype of FLOATS) {
        const x = Tensor.from(input, [input.length], { dtype, requiresGrad: true });
        const y = relu(x);
        assertLikeTorch(await y.read(), numbers(torch.relu.y), `relu ${dtype} vec4=${vec4}`);
        backward(sum(y));
        assertLikeTorch(await x.grad!.read(), numbers(torch.relu.grad), `relu grad ${dtype}`);
        // The layer is the same op.
        const layer = tidy(() => new ReLU().forward(x));
        assertLikeTorch(await layer.read(), numbers(torch.relu.y), `ReLU ${dtype}`);
        for (const t of [x, y, layer]) t.dispose();
      }
    });
  },
});

Deno.test({
  name: "numerics: GELU of NaN is NaN (exact and tanh forms, forward and gradient)",
  ...GPU_TEST,
  async fn() {
    // ±Infinity aside: PyTorch's −inf·Φ(−inf) = NaN is an artifact of its formula.
    const keep = numbers(torch.input).map((v, i) => [v, i] as const).filter(([v]) =>
      Number.isNaN(v) || Number.isFinite(v)
    );
    const input = keep.map(([v]) => v);
    const pick = (values: (number | string)[]) => keep.map(([, i]) => Number(values[i]));
    for (const [approximate, ref] of [["none", torch.gelu], ["tanh", torch.gelu_tanh]] as const) {
      const x = Tensor.from(input, [input.length], { requiresGrad: true });
      const y = gelu(x, { approximate });
      assertLikeTorch(await y.read(), pick(ref.y), `gelu ${approximate}`, 1e-5);
      backward(sum(y));
      assertLikeTorch(await x.grad!.read(), pick(ref.grad), `gelu ${approximate} grad`, 1e-5);
      x.dispose();
      y.dispose();
    }
  },
});

Deno.test({
  name: "numerics: a linear layer's fused ReLU passes NaN and ±inf as PyTorch's relu(linear)",
  ...GPU_TEST,
  async fn() {
    const ref = torch.linear_relu;
    const x = Tensor.from(numbers(ref.x), ref.x_shape);
    const w = Tensor.from(numbers(ref.w), ref.w_shape);
    const bias = Tensor.from(numbers(ref.b), [ref.b.length]);
    // One tiling of each variant: each writes the epilogue in its own code.
    const variants = new Map(MATMUL_CANDIDATES.map((t) => [t.variant, t]));
    for (const tiling of variants.values()) {
      await withTiling(tiling, async () => {
        const y = linear(x, w, { bias, activation: "relu" });
        assertLikeTorch(await y.read(), numbers(ref.y), `linear relu ${tiling.variant}`, 1e-6);
        y.dispose();
      });
    }
    const layer = new Linear(2, 3, { activation: "relu" });
    layer.weight.copyFrom(w);
    layer.bias!.copyFrom(bias);
    const y = layer.forward(x);
    assertLikeTorch(await y.read(), numbers(ref.y), "Linear relu", 1e-6);
    for (const t of [x, w, bias, y, layer]) t.dispose();
    // conv2d's fused ReLU is the same epilogue: relu(−x) over a 1×1 kernel.
    const input = numbers(torch.input);
    const image = Tensor.from(input, [1, 1, 2, input.length / 2]);
    const minus = Tensor.from([-1], [1, 1, 1, 1]);
    const conv = conv2d(image, minus, { activation: "relu" });
    const negated = numbers(torch.input).map((v) => -v);
    const expected = negated.map((v) => Number.isNaN(v) ? NaN : Math.max(v, 0));
    assertLikeTorch(await conv.read(), expected, "conv2d relu");
    for (const t of [image, minus, conv]) t.dispose();
  },
});

Deno.test({
  name: "numerics: max pooling and the max reduction propagate NaN, as in PyTorch",
  ...GPU_TEST,
  async fn() {
    {
      const pool = torch.max_pool2d;
      for (const dtype of FLOATS) {
        const x = Tensor.from(numbers(pool.x), pool.shape, { dtype });
        const y = maxPool2d(x, { kernelSize: 2 });
        assertLikeTorch(await y.read(), numbers(pool.y), `maxPool2d ${dtype}`);
      }
      const rows = torch.reduce_rows;
      const r = Tensor.from(numbers(rows.x), rows.shape);
      for (const [name, op] of [["max", max], ["sum", sum], ["mean", mean]] as const) {
        const got = await noGrad(() => op(r, { axis: 1 })).read();
        assertLikeTorch(got, numbers(rows[name]), `${name} of rows`, 1e-6);
      }
      const whole = await noGrad(() => max(r)).read();
      assert.ok(Number.isNaN(whole[0]), `max of a tensor holding NaN is NaN, got ${whole[0]}`);
    }
  },
});

Deno.test({
  name: "numerics: dropout multiplies by its mask as PyTorch: a dropped NaN or ±inf is NaN",
  ...GPU_TEST,
  async fn() {
    // PyTorch computes x · mask / (1 − p), so a dropped non-finite x is x · 0 = NaN, not 0.
    const pattern = [NaN, Infinity, -Infinity, 1.5];
    const input = Array.from({ length: 256 }, (_, i) => pattern[i % 4]);
    for (const dtype of FLOATS) {
      const x = Tensor.from(input, [input.length], { dtype });
      const y = dropout(x, 0.5, new RandomGenerator(3).take(x.size));
      const got = await y.read();
      let kept = 0, dropped = 0;
      input.forEach((v, i) => {
        const scaled = v * 2;
        if (Number.isNaN(got[i]) ? Number.isNaN(scaled) : got[i] === scaled) kept++;
        else {
          assertLikeTorch([got[i]], [v * 0], `dropped ${v} (${dtype})`);
          dropped++;
        }
      });
      assert.ok(kept > 50 && dropped > 50, `both kept (${kept}) and dropped (${dropped}) values`);
      x.dispose();
      y.dispose();
    }
  },
});

Deno.test({
  name: "numerics: reductions and cross-entropy over zero elements give PyTorch's values",
  ...GPU_TEST,
  async fn() {
    const ref = torch.empty;
    {
      const empty = Tensor.zeros([0, 3]);
      assertLikeTorch(await sum(empty).read(), [Number(ref.sum)], "sum of nothing");
      assertLikeTorch(await mean(empty).read(), [Number(ref.mean)], "mean of nothing");
      assertLikeTorch(await sum(empty, { axis: 0 }).read(), numbers(ref.sum_axis0), "sum axis 0");
      assertLikeTorch(
        await mean(empty, { axis: 0 }).read(),
        numbers(ref.mean_axis0),
        "mean axis 0",
      );
      const logits = Tensor.zeros([0, 3], { requiresGrad: true });
      const loss = crossEntropy(logits, []);
      assertLikeTorch(await loss.read(), [Number(ref.cross_entropy_mean)], "mean cross-entropy");
      const summed = crossEntropy(logits, [], { reduction: "sum" });
      assertLikeTorch(await summed.read(), [Number(ref.cross_entropy_sum)], "sum cross-entropy");
      backward(loss);
      assert.deepEqual(logits.grad!.shape, ref.cross_entropy_grad_shape);
    }
  },
});

Deno.test({
  name: "numerics: a static loss scale that overflows f16 for nearly any gradient warns once",
  ...GPU_TEST,
  async fn() {
    const sane = await capturedWarnings(() => {
      new GradScaler({ lossScale: 2 ** 16 }).dispose();
      new GradScaler().dispose(); // dynamic: backs off by itself
    });
    assert.deepEqual(sane, []);
    const huge = await capturedWarnings(() => {
      new GradScaler({ lossScale: 2 ** 30 }).dispose();
      new GradScaler({ lossScale: 2 ** 30 }).dispose();
    });
    assert.equal(huge.length, 1, `one warning: ${huge}`);
    assert.match(huge[0], /GradScaler: a static lossScale of 1073741824 .*overflows f16/);
    assert.match(huge[0], /lossScale 0/);
    // The trainer's static scale is the scaler's.
    const layer = new Linear(2, 2);
    const trainer = await capturedWarnings(() =>
      new AmpTrainer(layer, new SGD(layer.parameters(), { lr: 0.1 }), { lossScale: 2 ** 24 })
    );
    assert.equal(trainer.length, 1, `the trainer warns too: ${trainer}`);
    layer.dispose();
  },
});
