/**
 * `linear(x, W, { geluInput })`: the result and every gradient equal
 * `linear(gelu(x), W)` bit for bit (the same kernels, with gelu(x)
 * recomputed in backward) and the f64 reference; only x is kept for
 * backward, so a transformer MLP holds one hidden activation instead of two.
 */
import assert from "node:assert/strict";
import {
  autocast,
  backward,
  type FloatDType,
  gelu,
  linear,
  RandomGenerator,
  sum,
  Tensor,
  TransformerBlock,
  ValueError,
} from "../../../mod.ts";
import { DTYPES } from "../../../gpu/mod.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { assertClose, TOL } from "../../helpers/assert.ts";
import { quantize } from "../../helpers/reference.ts";

/** GELU in f64: exact (erf by its series) or the tanh form. */
function gelu64(x: number, approximate: "none" | "tanh"): number {
  if (approximate === "tanh") {
    return 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
  }
  // erf(z) = 2/√π Σ (-1)^n z^(2n+1) / (n! (2n+1)), converged for |z| < 4 in 60 terms.
  const z = x / Math.SQRT2;
  let term = z, erf = z;
  for (let n = 1; n < 60; n++) {
    term *= -z * z / n;
    erf += term / (2 * n + 1);
  }
  return 0.5 * x * (1 + (2 / Math.sqrt(Math.PI)) * erf);
}

interface Run {
  y: Float32Array | Int32Array;
  dx: Float32Array | Int32Array;
  dw: Float32Array | Int32Array;
  db: Float32Array | Int32Array;
}

async function run(
  fused: boolean,
  approximate: "none" | "tanh",
  dtype: FloatDType,
  [rows, inF, outF]: number[],
): Promise<Run> {
  const rng = new RandomGenerator(rows + inF + outF);
  const x = Tensor.from(rng.uniform(rows * inF, -3, 3), [rows, inF], { dtype, requiresGrad: true });
  const w = Tensor.from(rng.uniform(outF * inF, -0.5, 0.5), [outF, inF], {
    dtype,
    requiresGrad: true,
  });
  const b = Tensor.from(rng.uniform(outF, -0.5, 0.5), [outF], { requiresGrad: true });
  const g = Tensor.from(rng.uniform(rows * outF, -1, 1), [rows, outF], { dtype });
  const y = fused
    ? linear(x, w, { bias: b, geluInput: approximate })
    : linear(gelu(x, { approximate }), w, { bias: b });
  backward(y, { gradient: g });
  const out = {
    y: await y.read(),
    dx: await x.grad!.read(),
    dw: await w.grad!.read(),
    db: await b.grad!.read(),
  };
  [x, w, b, g, y].forEach((t) => t.dispose());
  return out;
}

Deno.test({
  name: "linear geluInput: equals linear(gelu(x)) bit for bit and the f64 reference, odd shapes",
  ...GPU_TEST,
  async fn() {
    for (const dtype of DTYPES) {
      for (const approximate of ["none", "tanh"] as const) {
        for (const dims of [[1, 1, 1], [7, 33, 5], [33, 65, 129]]) {
          const label = `${dtype} ${approximate} ${dims}`;
          const fused = await run(true, approximate, dtype, dims);
          const composed = await run(false, approximate, dtype, dims);
          assert.deepEqual(fused, composed, label);
          // y = gelu(x)·Wᵀ + b in f64 from the same (rounded) inputs.
          const [rows, inF, outF] = dims;
          const rng = new RandomGenerator(rows + inF + outF);
          const x = quantize(rng.uniform(rows * inF, -3, 3), dtype);
          const w = quantize(rng.uniform(outF * inF, -0.5, 0.5), dtype);
          const b = rng.uniform(outF, -0.5, 0.5);
          const expected = new Float64Array(rows * outF);
          for (let r = 0; r < rows; r++) {
            for (let o = 0; o < outF; o++) {
              let acc = b[o];
              for (let i = 0; i < inF; i++) {
                // A half path stores gelu(x) in its dtype before the product, as the composition does.
                const a = quantize([gelu64(x[r * inF + i], approximate)], dtype)[0];
                acc += a * w[o * inF + i];
              }
              expected[r * outF + o] = acc;
            }
          }
          // bf16: 2⁻⁸ rounding of y and of gelu(x) (one ulp off where the GPU's f32 GELU
          // rounds the other way from the f64 one), 8 times f16's 2⁻¹¹.
          const tol = dtype === "f16"
            ? { atol: 4e-3 * Math.sqrt(inF), rtol: 4e-3 }
            : dtype === "bf16"
            ? { atol: 3.2e-2 * Math.sqrt(inF), rtol: 3.2e-2 }
            : { atol: TOL.f32.atol * Math.sqrt(inF), rtol: TOL.f32.rtol };
          assertClose(fused.y, expected, tol, label);
        }
      }
    }
  },
});

Deno.test({
  name: "linear geluInput: keeps only x for backward (one activation less than gelu then linear)",
  ...GPU_TEST,
  fn() {
    const rows = 64, inF = 256, outF = 16;
    const held = (fused: boolean) => {
      const x0 = Tensor.from(new RandomGenerator(1).uniform(rows * inF, -1, 1), [rows, inF]);
      const w = Tensor.from(new RandomGenerator(2).uniform(outF * inF, -1, 1), [outF, inF], {
        requiresGrad: true,
      });
      const x = x0.share([rows, inF]);
      const before = gpu.memoryStats().allocatedBytes;
      const act = fused ? x : gelu(x);
      const y = linear(act, w, fused ? { geluInput: "tanh" } : {});
      if (act !== x) act.dispose();
      const bytes = gpu.memoryStats().allocatedBytes - before;
      const loss = sum(y);
      backward(loss);
      [x0, x, w, y, loss].forEach((t) => t.dispose());
      return bytes;
    };
    const composed = held(false), fused = held(true);
    // The composition keeps gelu(x) [64, 256] f32 alive for the weight gradient.
    assert.equal(composed - fused, rows * inF * 4, `composed ${composed} B, fused ${fused} B`);
  },
});

Deno.test({
  name: "linear geluInput: a TransformerBlock under autocast trains as with a separate GELU",
  ...GPU_TEST,
  async fn() {
    // The block's MLP is fc2(gelu(fc1(x))); fc2 now applies the GELU itself: the exact
    // form by default (PyTorch's nn.GELU()), the tanh form when asked.
    for (const form of [undefined, "tanh"] as const) {
      const block = new TransformerBlock(32, 4, { seed: 3, gelu: form });
      assert.equal(block.fc2.geluInput, form ?? "none");
      const x = Tensor.from(new RandomGenerator(4).uniform(2 * 5 * 32, -1, 1), [2, 5, 32]);
      const reference = (h: Tensor) =>
        linear(gelu(h, { approximate: form }), block.fc2.weight, { bias: block.fc2.bias });
      for (const amp of [false, true]) {
        const mlp = (viaBlock: boolean) =>
          autocast(() => {
            const h = block.fc1.forward(x);
            const y = viaBlock ? block.fc2.forward(h) : reference(h);
            const loss = sum(y);
            backward(loss);
            return loss;
          }, { enabled: amp });
        const grads = async () => {
          const out = await Promise.all(block.parameters().map((p) => p.grad?.read()));
          block.zeroGrad();
          return out;
        };
        const a = await (mlp(true)).read(), ga = await grads();
        const b = await (mlp(false)).read(), gb = await grads();
        assert.deepEqual(a, b, `loss, amp ${amp}, gelu ${form}`);
        assert.deepEqual(ga, gb, `gradients, amp ${amp}, gelu ${form}`);
      }
      if (form === "tanh") {
        assert.throws(
          // deno-lint-ignore no-explicit-any
          () => linear(x, block.fc1.weight, { geluInput: "erf" as any }),
          (e: unknown) =>
            e instanceof ValueError && /geluInput must be "none" or "tanh"/.test(e.message),
        );
      }
    }
  },
});
