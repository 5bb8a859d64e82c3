/**
 * Each op of the GPT's forward and backward at the GPT's shapes (see
 * bench/gpt.ts), in f32 and f16: GPU ms forward and backward, the rate
 * (TFLOP/s for products, GB/s for the rest, from the bytes the kernels
 * bind), and the JavaScript it takes to record one op.
 */
import {
  add,
  causalAttention,
  causalSoftmax,
  crossEntropy,
  embedding,
  type FloatDType,
  gelu,
  type Gpu,
  layerNorm,
  linear,
  matmul,
  noGrad,
  permute,
  RandomGenerator,
  Tensor,
  tidy,
} from "../../mod.ts";
import { type BenchOptions, gpuTimed, resolveSize, type Result } from "./harness.ts";
import { gptConfig } from "./gpt.ts";

/** One op at its shape: inputs that need gradients, and the forward. */
interface OpCase {
  name: string;
  shape: string;
  /** Makes the inputs (fresh ones, requiring grad where the op has a gradient). */
  inputs(): Tensor[];
  /** The op itself. */
  forward(inputs: Tensor[]): Tensor;
}

/** The GPT's ops at its shapes, in `dtype` (parameters of LayerNorm and biases stay f32). */
function opCases(size: "real" | "small", dtype: FloatDType): OpCase[] {
  const g = gptConfig(size);
  const rows = g.batch * g.context, c = g.dim, h = g.heads, d = c / h, t = g.context;
  const rng = new RandomGenerator(3);
  const grad = { requiresGrad: true };
  const t16 = (shape: number[], requiresGrad = true) =>
    Tensor.from(rng.uniform(shape.reduce((a, b) => a * b, 1), -1, 1), shape, {
      dtype,
      requiresGrad,
    });
  const f32 = (shape: number[], fill = 0) => Tensor.full(shape, fill, grad);
  const ids = Tensor.from(
    Array.from({ length: rows }, (_, i) => (i * 7) % g.vocab),
    [g.batch, t],
    { dtype: "i32" },
  );
  const targets = Tensor.from(
    Array.from({ length: rows }, (_, i) => (i * 5) % g.vocab),
    [rows],
    { dtype: "i32" },
  );
  const lin = (name: string, inF: number, outF: number): OpCase => ({
    name: `linear ${name}`,
    shape: `${rows}×${inF}→${outF} +bias`,
    inputs: () => [t16([rows, inF]), t16([outF, inF]), f32([outF])],
    forward: ([x, w, b]) => linear(x, w, { bias: b }),
  });
  return [
    {
      name: "embedding",
      shape: `[${g.batch}, ${t}] of ${g.vocab}×${c}`,
      inputs: () => [t16([g.vocab, c])],
      forward: ([table]) => embedding(table, ids),
    },
    {
      name: "add (residual)",
      shape: `[${rows}, ${c}]`,
      inputs: () => [t16([rows, c]), t16([rows, c])],
      forward: ([a, b]) => add(a, b),
    },
    {
      name: "layerNorm",
      shape: `[${rows}, ${c}]`,
      inputs: () => [t16([rows, c]), f32([c], 1), f32([c])],
      forward: ([x, weight, bias]) => layerNorm(x, { weight, bias }),
    },
    lin("qkv", c, 3 * c),
    lin("out", c, c),
    lin("fc1", c, 4 * c),
    {
      name: "gelu",
      shape: `[${rows}, ${4 * c}]`,
      inputs: () => [t16([rows, 4 * c])],
      forward: ([x]) => gelu(x),
    },
    lin("fc2", 4 * c, c),
    {
      name: "permute 0213",
      shape: `[${g.batch}, ${t}, ${h}, ${d}]`,
      inputs: () => [t16([g.batch, t, h, d])],
      forward: ([x]) => permute(x, [0, 2, 1, 3]),
    },
    {
      name: "matmul q·kᵀ",
      shape: `[${g.batch * h}, ${t}, ${d}]²`,
      inputs: () => [t16([g.batch * h, t, d]), t16([g.batch * h, t, d])],
      forward: ([q, k]) => matmul(q, k, { transB: true }),
    },
    {
      name: "causalSoftmax",
      shape: `[${g.batch * h}, ${t}, ${t}]`,
      inputs: () => [t16([g.batch * h, t, t])],
      forward: ([s]) => causalSoftmax(s, { scale: 1 / Math.sqrt(d) }),
    },
    {
      name: "matmul p·v",
      shape: `[${g.batch * h}, ${t}, ${t}]·[${g.batch * h}, ${t}, ${d}]`,
      inputs: () => [t16([g.batch * h, t, t]), t16([g.batch * h, t, d])],
      forward: ([p, v]) => matmul(p, v),
    },
    ...[true, false].map((fused): OpCase => ({
      name: `attention (${fused ? "fused" : "unfused: permutes, matmuls, causal softmax"})`,
      shape: `[${g.batch}, ${t}, ${c}]³, ${h} heads`,
      inputs: () => [t16([g.batch, t, c]), t16([g.batch, t, c]), t16([g.batch, t, c])],
      forward: ([q, k, v]) => causalAttention(q, k, v, { heads: h, fused }),
    })),
    {
      name: "crossEntropy",
      shape: `[${rows}, ${g.vocab}]`,
      inputs: () => [t16([rows, g.vocab])],
      forward: ([logits]) => crossEntropy(logits, targets),
    },
  ];
}

/** ms, rate and JS µs of one op forward (no tape) and forward + backward. */
async function measure(gpu: Gpu, op: OpCase, repeats: number) {
  const inputs = op.inputs();
  const forward = () => tidy(() => noGrad(() => void op.forward(inputs)));
  const fwd = await gpuTimed(gpu, repeats, forward);
  const both = await gpuTimed(gpu, repeats, () =>
    tidy(() => {
      const y = op.forward(inputs);
      y.backward(y.size === 1 ? {} : { gradient: Tensor.full(y.shape, 1e-3, { dtype: y.dtype }) });
      for (const x of inputs) {
        x.grad?.dispose();
        x.grad = null;
      }
    }));
  // JavaScript per op: recording alone, on an idle GPU and without submits.
  const policy = gpu.batch.flushPolicy, count = Math.max(repeats, 20);
  gpu.batch.flushPolicy = { maxDispatches: Infinity, maxWork: Infinity };
  const start = performance.now();
  for (let i = 0; i < count; i++) forward();
  const jsUs = ((performance.now() - start) * 1000) / count;
  gpu.batch.flushPolicy = policy;
  await gpu.sync();
  for (const x of inputs) x.dispose();
  const rate = (t: typeof fwd, ms: number) =>
    t.flops !== null
      ? { tflops: t.flops / (ms / 1000) / 1e12 }
      : { gbPerSec: (t.bytes ?? 0) / (ms / 1000) / 1e9 };
  const bwdMs = Math.max(both.ms - fwd.ms, 0);
  const bwdWork = {
    ...both,
    flops: both.flops !== null ? both.flops - (fwd.flops ?? 0) : null,
    bytes: both.bytes !== null ? both.bytes - (fwd.bytes ?? 0) : null,
  };
  return {
    fwdMs: fwd.ms,
    bwdMs,
    fwd: rate(fwd, fwd.ms),
    bwd: rate(bwdWork, bwdMs),
    jsUs,
    timing: fwd.timing,
  };
}

/** Every GPT op in f32 and f16. */
export async function benchOps(gpu: Gpu, o: BenchOptions): Promise<Result[]> {
  const size = resolveSize(gpu, o.size);
  const results: Result[] = [];
  for (const dtype of ["f32", "f16"] as FloatDType[]) {
    if (dtype === "f16" && !gpu.f16) continue;
    for (const op of opCases(size, dtype)) {
      gpu.resetPeakMemory();
      const m = await measure(gpu, op, o.repeats);
      results.push({
        bench: "ops",
        mode: dtype,
        op: op.name,
        shape: op.shape,
        size,
        fwdMs: m.fwdMs,
        bwdMs: m.bwdMs,
        ...Object.fromEntries(Object.entries(m.fwd).map(([k, v]) => [`fwd_${k}`, v])),
        ...Object.fromEntries(Object.entries(m.bwd).map(([k, v]) => [`bwd_${k}`, v])),
        jsUsPerOp: m.jsUs,
        timing: m.timing,
        peakBytes: gpu.memoryStats().peakBytes,
      });
    }
  }
  return results;
}
