/**
 * Pooling against PyTorch itself: `fixtures/torch/pooling.json` (written by
 * `make_pooling.py` with torch 1.13) holds max pooling's flat indices where
 * windows tie, hold NaN or infinities, pad, dilate or overhang (`ceil_mode`),
 * and average pooling with `ceil_mode` and `divisor_override`, each with the
 * input gradient for a random upstream gradient.
 */
import assert from "node:assert/strict";
import { avgPool2d, backward, maxPool2d, noGrad, Tensor } from "../../gpu/mod.ts";
import { AvgPool2d, MaxPool2d } from "../../nn/mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { assertClose, TOL } from "../helpers/assert.ts";

const fixture = JSON.parse(
  await Deno.readTextFile(new URL("../fixtures/torch/pooling.json", import.meta.url)),
);

interface TorchOptions {
  kernel_size: number | [number, number];
  stride?: number | [number, number];
  padding?: number | [number, number];
  dilation?: number | [number, number];
  ceil_mode?: boolean;
  count_include_pad?: boolean;
  divisor_override?: number;
}

interface Case {
  name: string;
  options: TorchOptions;
  shape: number[];
  x: (number | string)[];
  y_shape: number[];
  y: (number | string)[];
  indices?: number[];
  g: (number | string)[];
  dx: (number | string)[];
}

/** PyTorch's keyword arguments as halfstep's options. */
function optionsOf(o: TorchOptions) {
  return {
    kernelSize: o.kernel_size,
    ...(o.stride !== undefined && { stride: o.stride }),
    ...(o.padding !== undefined && { padding: o.padding }),
    ...(o.dilation !== undefined && { dilation: o.dilation }),
    ...(o.ceil_mode !== undefined && { ceilMode: o.ceil_mode }),
    ...(o.count_include_pad !== undefined && { countIncludePad: o.count_include_pad }),
    ...(o.divisor_override !== undefined && { divisorOverride: o.divisor_override }),
  };
}

/** JSON's "NaN" / "Infinity" strings as numbers. */
const numbers = (values: (number | string)[]): number[] => values.map(Number);

/** Exact equality that treats NaN as equal to NaN (max pooling copies the chosen element). */
function assertSameValues(got: ArrayLike<number>, want: number[], what: string): void {
  assert.deepEqual(Array.from(got, String), want.map(String), what);
}

const FLOATS: ("f32" | "f16")[] = gpu.f16 ? ["f32", "f16"] : ["f32"];

Deno.test({
  name: "torch pooling: maxPool2d's returnIndices gives PyTorch's flat indices (ties, NaN, " +
    "infinities, padding, dilation, ceilMode), its values and input gradients",
  ...GPU_TEST,
  async fn() {
    for (const c of fixture.max_pool2d as Case[]) {
      // The random case's values would tie differently once rounded to f16.
      for (const dtype of c.name === "random" ? ["f32" as const] : FLOATS) {
        const label = `${c.name} (${dtype})`;
        const x = Tensor.from(numbers(c.x), c.shape, { dtype, requiresGrad: true });
        const [y, indices] = maxPool2d(x, { ...optionsOf(c.options), returnIndices: true });
        assert.deepEqual(y.shape, c.y_shape, `${label}: shape`);
        assert.deepEqual(indices.shape, c.y_shape, `${label}: indices shape`);
        assert.equal(indices.dtype, "i32", `${label}: indices dtype`);
        assert.deepEqual([...(await indices.read())], c.indices, `${label}: indices`);
        assertSameValues(await y.read(), numbers(c.y), `${label}: values`);
        backward(y, { gradient: Tensor.from(numbers(c.g), c.y_shape, { dtype }) });
        assertClose(await x.grad!.read(), numbers(c.dx), TOL[dtype], `${label}: dx`);
        // Without returnIndices and without the tape, the same values come back.
        const plain = noGrad(() => maxPool2d(x, optionsOf(c.options)));
        assertSameValues(await plain.read(), numbers(c.y), `${label}: values, no indices`);
        for (const t of [x, y, indices, plain]) t.dispose();
      }
    }
  },
});

Deno.test({
  name: "torch pooling: avgPool2d with ceilMode, countIncludePad and divisorOverride gives " +
    "PyTorch's values and input gradients",
  ...GPU_TEST,
  async fn() {
    for (const c of fixture.avg_pool2d as Case[]) {
      const x = Tensor.from(numbers(c.x), c.shape, { requiresGrad: true });
      const y = avgPool2d(x, optionsOf(c.options));
      assert.deepEqual(y.shape, c.y_shape, `${c.name}: shape`);
      assertClose(await y.read(), numbers(c.y), TOL.f32, `${c.name}: values`);
      backward(y, { gradient: Tensor.from(numbers(c.g), c.y_shape) });
      assertClose(await x.grad!.read(), numbers(c.dx), TOL.f32, `${c.name}: dx`);
      x.dispose();
      y.dispose();
    }
  },
});

Deno.test({
  name: "torch pooling: the MaxPool2d and AvgPool2d layers take ceilMode and divisorOverride",
  ...GPU_TEST,
  async fn() {
    const find = (list: Case[], name: string) => list.find((c) => c.name === name)!;
    const max = find(fixture.max_pool2d, "ceil_mode padding");
    const maxLayer = new MaxPool2d(optionsOf(max.options));
    assert.equal(maxLayer.ceilMode, true);
    const y = maxLayer.forward(Tensor.from(numbers(max.x), max.shape));
    assertSameValues(await y.read(), numbers(max.y), "MaxPool2d");
    const avg = find(fixture.avg_pool2d, "divisor_override ceil_mode");
    const avgLayer = new AvgPool2d(optionsOf(avg.options));
    assert.equal(avgLayer.divisorOverride, 5);
    const z = avgLayer.forward(Tensor.from(numbers(avg.x), avg.shape));
    assertClose(await z.read(), numbers(avg.y), TOL.f32, "AvgPool2d");
  },
});
