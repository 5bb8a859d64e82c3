/**
 * Convolution benchmarks: the MNIST CNN's training step (f32, AMP, AMP +
 * checkpointing: steps/s and peak bytes), and conv2d GFLOP/s at ResNet-like
 * shapes, forward and forward + backward (dx and dweight), in f32 and f16.
 * GPU timestamps where the adapter has them.
 */
import {
  conv2d,
  type FloatDType,
  type Gpu,
  noGrad,
  RandomGenerator,
  Tensor,
  tidy,
} from "../../mod.ts";
import { type BenchOptions, gpuTimed, resolveSize, type Result } from "./harness.ts";
import { benchCnnTraining } from "./training.ts";

/** One convolution to time: x [n, c, h, h] with an o × c × k × k kernel. */
interface ConvShape {
  label: string;
  n: number;
  c: number;
  h: number;
  o: number;
  k: number;
  stride: number;
  padding: number;
}

/** ResNet-like layers; `small` shrinks the batch so a CPU adapter finishes in seconds. */
function shapes(size: "real" | "small"): ConvShape[] {
  const n = size === "real" ? 32 : 2;
  return [
    {
      label: `stem 3→64 7×7/2, 224², batch ${n}`,
      n,
      c: 3,
      h: 224,
      o: 64,
      k: 7,
      stride: 2,
      padding: 3,
    },
    { label: `64→64 3×3, 56², batch ${n}`, n, c: 64, h: 56, o: 64, k: 3, stride: 1, padding: 1 },
    {
      label: `128→128 3×3, 28², batch ${n}`,
      n,
      c: 128,
      h: 28,
      o: 128,
      k: 3,
      stride: 1,
      padding: 1,
    },
    {
      label: `256→256 3×3, 14², batch ${n}`,
      n,
      c: 256,
      h: 14,
      o: 256,
      k: 3,
      stride: 1,
      padding: 1,
    },
    {
      label: `128→256 1×1/2, 28², batch ${n}`,
      n,
      c: 128,
      h: 28,
      o: 256,
      k: 1,
      stride: 2,
      padding: 0,
    },
  ];
}

/** GFLOP/s of each shape's forward, and of forward + both backward products. */
async function benchConvShapes(gpu: Gpu, o: BenchOptions): Promise<Result[]> {
  const size = resolveSize(gpu, o.size);
  const results: Result[] = [];
  for (const dtype of ["f32", "f16"] as FloatDType[]) {
    if (dtype === "f16" && !gpu.f16) continue;
    for (const s of shapes(size)) {
      const rng = new RandomGenerator(1);
      const x = Tensor.from(rng.uniform(s.n * s.c * s.h * s.h, -1, 1), [s.n, s.c, s.h, s.h], {
        dtype,
        requiresGrad: true,
      });
      const w = Tensor.from(rng.uniform(s.o * s.c * s.k * s.k, -1, 1), [s.o, s.c, s.k, s.k], {
        dtype,
        requiresGrad: true,
      });
      const options = { stride: s.stride, padding: s.padding };
      const out = Math.floor((s.h + 2 * s.padding - s.k) / s.stride) + 1;
      const flops = 2 * s.n * s.o * out * out * s.c * s.k * s.k;
      const repeats = flops > 1e10 ? Math.min(o.repeats, 3) : o.repeats;
      gpu.resetPeakMemory();
      const forward = await gpuTimed(
        gpu,
        repeats,
        () => noGrad(() => tidy(() => void conv2d(x, w, options))),
      );
      const both = await gpuTimed(gpu, repeats, () => {
        const y = conv2d(x, w, options);
        const gradient = Tensor.full(y.shape, 1, { dtype });
        y.backward({ gradient });
        for (const t of [y, gradient, x.grad!, w.grad!]) t.dispose();
        x.grad = w.grad = null;
      });
      results.push({
        bench: "cnn",
        mode: dtype,
        shape: s.label,
        size,
        gflops: flops / (forward.ms / 1000) / 1e9,
        fwdBwdGflops: (3 * flops) / (both.ms / 1000) / 1e9,
        msForward: forward.ms,
        msForwardBackward: both.ms,
        timing: forward.timing,
        peakBytes: gpu.memoryStats().peakBytes,
      });
      x.dispose();
      w.dispose();
    }
  }
  return results;
}

/** `deno task bench cnn`: the MNIST CNN's training step, then the convolution shapes. */
export async function benchCnn(gpu: Gpu, o: BenchOptions): Promise<Result[]> {
  // A CNN step costs about 20 MLP steps on a CPU adapter.
  const steps = Math.max(3, Math.round(o.steps / 10));
  return [...await benchCnnTraining(gpu, steps), ...await benchConvShapes(gpu, o)];
}
