/**
 * The backward pass of `linear(x, W, { geluInput })` evaluates GELU once:
 * one elementwise pass gives gelu(x) for the weight gradient and x's
 * gradient through gelu′(x) (gpu/kernels/gelu_backward.ts), where it took a
 * recompute of gelu(x) and a second pass for gelu′(x). The gradients stay
 * those of `linear(gelu(x), W)` bit for bit, f32, f16 and bf16, both GELU
 * forms, at sizes that take the vec4 and the one-element kernels.
 */
import assert from "node:assert/strict";
import { backward, gelu, linear, RandomGenerator, Tensor } from "../../../mod.ts";
import { DTYPES } from "../../../gpu/mod.ts";
import { dispatchedKernels, gpu, GPU_TEST } from "../../helpers/gpu.ts";

const FLOATS = DTYPES.filter((d) => d !== "f16" || gpu.f16);

/** y and the gradients of x, W and the bias, read back, with the GELU fused into the linear or applied first. */
async function run(
  fused: boolean,
  approximate: "none" | "tanh",
  dtype: (typeof FLOATS)[number],
  [rows, inF, outF]: number[],
): Promise<{ keys: string[]; values: (Float32Array | Int32Array)[] }> {
  const rng = new RandomGenerator(rows * inF + outF);
  const grad = { dtype, requiresGrad: true };
  const x = Tensor.from(rng.uniform(rows * inF, -4, 4), [rows, inF], grad);
  const w = Tensor.from(rng.uniform(outF * inF, -0.5, 0.5), [outF, inF], grad);
  const b = Tensor.from(rng.uniform(outF, -0.5, 0.5), [outF], { requiresGrad: true });
  const g = Tensor.from(rng.uniform(rows * outF, -1, 1), [rows, outF], { dtype });
  let y!: Tensor;
  if (fused) y = linear(x, w, { bias: b, geluInput: approximate });
  else {
    const h = gelu(x, { approximate });
    y = linear(h, w, { bias: b });
    h.dispose();
  }
  const keys = dispatchedKernels(() => backward(y, { gradient: g }));
  const values = [await y.read(), ...await Promise.all([x, w, b].map((t) => t.grad!.read()))];
  for (const t of [x, w, b]) t.grad!.dispose();
  for (const t of [x, w, b, g, y]) t.dispose();
  return { keys, values };
}

Deno.test({
  name: "linear with a GELU input: backward is one GELU pass, and the gradients equal " +
    "linear(gelu(x)) bit for bit, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const shape of [[7, 12, 5], [3, 17, 9]]) {
      for (const dtype of FLOATS) {
        for (const approximate of ["none", "tanh"] as const) {
          const label = `${dtype} ${approximate} [${shape}]`;
          const fused = await run(true, approximate, dtype, shape);
          const composed = await run(false, approximate, dtype, shape);
          const gelus = fused.keys.filter((k) => k.includes("gelu"));
          assert.equal(gelus.length, 1, `${label}: GELU passes ${gelus.join(" | ")}`);
          assert.ok(gelus[0].startsWith("gelu_backward"), `${label}: ${gelus[0]}`);
          assert.deepEqual(fused.values, composed.values, label);
        }
      }
    }
  },
});
