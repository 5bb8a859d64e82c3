/**
 * Matmul benchmarks: square products, the MNIST MLP's first layer, a large
 * square product (4096³ at real size, 1024³ small), and the GPT's linear
 * layers in the three orientations a linear layer uses — x·Wᵀ forward, g·W
 * (dx) and gᵀ·x (dW) backward — in f32 and f16. GFLOP/s from GPU timestamps
 * where the adapter has them.
 */
import { type FloatDType, type Gpu, matmul, RandomGenerator, Tensor, tidy } from "../../mod.ts";
import { type BenchOptions, gpuTimed, resolveSize, type Result } from "./harness.ts";
import { gptConfig } from "./gpt.ts";

/** One product to time: A [m, k] (or Aᵀ) times B [k, n] (or Bᵀ). */
interface Product {
  label: string;
  m: number;
  n: number;
  k: number;
  transA?: boolean;
  transB?: boolean;
}

/** The GPT's three linear layers (C→C, C→4C, 4C→C) in their three orientations. */
function gptProducts(size: "real" | "small"): Product[] {
  const g = gptConfig(size);
  const rows = g.batch * g.context, c = g.dim;
  const layers: [string, number, number][] = [["qkv/out", c, c], ["fc1", c, 4 * c], [
    "fc2",
    4 * c,
    c,
  ]];
  return layers.flatMap(([name, inF, outF]) => [
    // y = x·Wᵀ: x [rows, in], W [out, in]
    { label: `GPT ${name} x·Wᵀ ${rows}×${inF}→${outF}`, m: rows, n: outF, k: inF, transB: true },
    // dx = g·W: g [rows, out], W [out, in]
    { label: `GPT ${name} g·W ${rows}×${outF}→${inF}`, m: rows, n: inF, k: outF },
    // dW = gᵀ·x: g [rows, out], x [rows, in]
    { label: `GPT ${name} gᵀ·x ${outF}×${rows}→${inF}`, m: outF, n: inF, k: rows, transA: true },
  ]);
}

/** Every product the entry times, for `size`. */
function products(size: "real" | "small"): Product[] {
  const big = size === "real" ? 4096 : 1024;
  return [
    { label: "512x512x512", m: 512, n: 512, k: 512 },
    { label: "128x784x256 (MLP layer 1)", m: 128, n: 256, k: 784 },
    { label: `${big}³`, m: big, n: big, k: big },
    ...gptProducts(size),
  ];
}

/** GFLOP/s of each product in f32 and f16. */
export async function benchMatmul(gpu: Gpu, o: BenchOptions): Promise<Result[]> {
  const size = resolveSize(gpu, o.size);
  const results: Result[] = [];
  for (const dtype of ["f32", "f16"] as FloatDType[]) {
    if (dtype === "f16" && !gpu.f16) continue;
    for (const p of products(size)) {
      const rng = new RandomGenerator(1);
      const aShape = p.transA ? [p.k, p.m] : [p.m, p.k],
        bShape = p.transB ? [p.n, p.k] : [p.k, p.n];
      const a = Tensor.from(rng.uniform(p.m * p.k, -1, 1), aShape, { dtype });
      const b = Tensor.from(rng.uniform(p.k * p.n, -1, 1), bShape, { dtype });
      gpu.resetPeakMemory();
      const flops = 2 * p.m * p.n * p.k;
      // Big products: fewer repeats, so a CPU adapter finishes in reasonable time.
      const repeats = flops > 1e10 ? Math.min(o.repeats, 3) : o.repeats;
      const t = await gpuTimed(
        gpu,
        repeats,
        () => tidy(() => void matmul(a, b, { transA: p.transA, transB: p.transB })),
      );
      results.push({
        bench: "matmul",
        mode: dtype,
        shape: p.label,
        size,
        gflops: flops / (t.ms / 1000) / 1e9,
        msPerOp: t.ms,
        timing: t.timing,
        peakBytes: gpu.memoryStats().peakBytes,
      });
      a.dispose();
      b.dispose();
    }
  }
  return results;
}
