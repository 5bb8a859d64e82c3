/**
 * Every matmul tiling candidate this adapter's tuner tries, timed on the
 * products that decide GPU speed: a big square (4096³ at real size, 512³
 * small) in the three orientations, the GPT's fc1 layer in the three
 * orientations of a linear layer (x·Wᵀ, g·W, gᵀ·x) and its attention
 * projection (n = 384), f32 and f16. For f16 the tilings that can sum in f16 are also
 * timed with `f16Accumulation: "chunked"`, the figure that decides whether
 * that option should become the default (it must be ≥ 1.15x the f32-sum
 * kernel). A product that splits its reduction (split-K: the weight
 * gradient gᵀ·x, whose K is every row) is timed split and unsplit
 * (`matmulSettings`' `splitKWorkgroups` = 0), the figure that says whether splitting pays
 * on the adapter. Each row says which candidate the tuner chose for the
 * product's class, so "the tuner is within 10% of the best" can be read off.
 * Where the adapter has subgroup matrices (the Dawn backend), the f16 rows
 * include every subgroup-matrix candidate (tensor cores), and the adapter's
 * configs are printed first and kept in every row.
 */
import {
  classOf,
  type Gpu,
  GpuError,
  matmulCandidates,
  tilingFor,
  tilingName,
} from "../../gpu/mod.ts";
import { launchMatmulInto, type MatmulProblem } from "../../gpu/kernels/gemm/matmul.ts";
import { gemmSplit } from "../../gpu/kernels/gemm/gemm.ts";
import { tilingKind } from "../../gpu/kernels/gemm/tilings.ts";
import { subgroupMatrixCandidates } from "../../gpu/kernels/gemm/candidates.ts";
import { matmulSettings } from "../../gpu/kernels/gemm/settings.ts";
import { RandomGenerator, Tensor } from "../../mod.ts";
import { type BenchOptions, gpuTimed, resolveSize, type Result } from "./harness.ts";
import { gptConfig } from "./gpt.ts";

/** A product of the entry: [m, n, k] and which operand is read transposed. */
interface Shape {
  label: string;
  m: number;
  n: number;
  k: number;
  orientation: "nn" | "nt" | "tn";
}

function shapes(size: "real" | "small"): Shape[] {
  const big = size === "real" ? 4096 : 512;
  const g = gptConfig(size);
  const rows = g.batch * g.context, c = g.dim;
  return [
    { label: `${big}³ A·B`, m: big, n: big, k: big, orientation: "nn" },
    { label: `${big}³ A·Bᵀ`, m: big, n: big, k: big, orientation: "nt" },
    { label: `${big}³ Aᵀ·B`, m: big, n: big, k: big, orientation: "tn" },
    { label: `GPT proj x·Wᵀ ${rows}×${c}→${c}`, m: rows, n: c, k: c, orientation: "nt" },
    { label: `GPT fc1 x·Wᵀ ${rows}×${c}→${4 * c}`, m: rows, n: 4 * c, k: c, orientation: "nt" },
    { label: `GPT fc1 g·W ${rows}×${4 * c}→${c}`, m: rows, n: c, k: 4 * c, orientation: "nn" },
    { label: `GPT fc1 gᵀ·x ${4 * c}×${rows}→${c}`, m: 4 * c, n: c, k: rows, orientation: "tn" },
  ];
}

function problemOf(s: Shape): MatmulProblem {
  const transA = s.orientation === "tn", transB = s.orientation === "nt";
  return {
    batch: 1,
    m: s.m,
    n: s.n,
    k: s.k,
    a: { batch: 0, row: transA ? 1 : s.k, col: transA ? s.m : 1 },
    b: { batch: 0, row: transB ? 1 : s.n, col: transB ? s.k : 1 },
  };
}

/**
 * GFLOP/s of every candidate (and chunked f16 where the tiling has it, and split
 * products unsplit) per product and dtype.
 */
export async function benchTilings(gpu: Gpu, o: BenchOptions): Promise<Result[]> {
  const subgroupMatrixConfigs = matrixConfigsOf(gpu);
  console.error(
    `bench tilings: subgroup-matrix configs of ${gpu.adapterName}: ${subgroupMatrixConfigs}`,
  );
  const size = resolveSize(gpu, o.size);
  const results: Result[] = [];
  const settings = matmulSettings.of(gpu);
  const accumulation = settings.f16Accumulation, splitTarget = settings.splitKWorkgroups;
  try {
    for (const dtype of ["f32", "f16"] as const) {
      if (dtype === "f16" && !gpu.f16) continue;
      for (const s of shapes(size)) {
        const problem = problemOf(s);
        const rng = new RandomGenerator(1);
        const a = Tensor.from(rng.uniform(s.m * s.k, -1, 1), [s.m * s.k], { dtype });
        const b = Tensor.from(rng.uniform(s.k * s.n, -1, 1), [s.k * s.n], { dtype });
        const c = Tensor.empty([s.m * s.n], dtype, gpu);
        const chosen = tilingName(tilingFor(gpu, problem, dtype));
        const flops = 2 * s.m * s.n * s.k;
        const repeats = flops > 1e10 ? Math.min(o.repeats, 3) : o.repeats;
        for (const tiling of benchedTilings(gpu, dtype)) {
          const sums = dtype === "f16" && tilingKind(tiling).f16Chunks
            ? ["f32", "chunked"] as const
            : ["f32"] as const;
          const split = gemmSplit(gpu, tiling, problem, 1).slices;
          for (const sum of sums) {
            for (const splitting of split > 1 ? [true, false] : [true]) {
              settings.f16Accumulation = sum;
              settings.splitKWorkgroups = splitting ? splitTarget : 0;
              const slices = gemmSplit(gpu, tiling, problem, 1).slices;
              gpu.resetPeakMemory();
              const t = await timedOrFailed(
                gpu,
                repeats,
                () => launchMatmulInto(problem, a, b, c, {}, tiling),
              );
              const name = `${tilingName(tiling)}${sum === "chunked" ? " chunked" : ""}${
                split > 1 ? (splitting ? ` split×${slices}` : " unsplit") : ""
              }`;
              const isChosen = tilingName(tiling) === chosen && sum === accumulation && splitting;
              results.push({
                bench: "tilings",
                mode: dtype,
                // The table shows the shape column: the product, the candidate, * for the tuner's pick.
                shape: `${s.label} ${name}${isChosen ? " *" : ""}`,
                product: s.label,
                size,
                class: `${classOf(problem, dtype).size}`,
                tiling: tilingName(tiling),
                f16Accumulation: dtype === "f16" ? sum : null,
                slices,
                chosen: isChosen,
                subgroupMatrixConfigs,
                gflops: flops / (t.ms / 1000) / 1e9,
                msPerOp: t.ms,
                timing: t.timing,
                ...(t.error && { error: t.error }),
                peakBytes: gpu.memoryStats().peakBytes,
              });
            }
          }
        }
        [a, b, c].forEach((t) => t.dispose());
      }
    }
  } finally {
    settings.f16Accumulation = accumulation;
    settings.splitKWorkgroups = splitTarget;
  }
  return results;
}

/**
 * The adapter's subgroup-matrix shapes in one line (`"f16>f32 16x16x16, ...
 * (subgroups of 32)"`), or why there are none: every subgroup-matrix
 * candidate's row comes with it.
 */
function matrixConfigsOf(gpu: Gpu): string {
  const configs = gpu.adapterProfile.subgroupMatrixConfigs;
  if (configs.length === 0) return "none (the Dawn backend lists them where the driver has them)";
  const shapes = configs.map((c) =>
    `${c.componentType}>${c.resultComponentType} ${c.M}x${c.N}x${c.K}`
  );
  return `${shapes.join(", ")} (subgroups of ${configs[0].subgroupSize})`;
}

/**
 * `gpuTimed`, or where the candidate's kernel fails on this adapter (a
 * subgroup-matrix shape its driver rejects) Infinity ms and the error's first
 * line, so one candidate cannot stop the benchmark.
 */
async function timedOrFailed(gpu: Gpu, repeats: number, fn: () => void) {
  try {
    return { ...await gpuTimed(gpu, repeats, fn), error: undefined };
  } catch (e) {
    gpu.throwIfFailed();
    if (!(e instanceof GpuError)) throw e;
    return { ms: Infinity, timing: "failed", error: e.message.split("\n")[0].slice(0, 300) };
  }
}

/**
 * The tilings timed for `dtype`: the tuner's candidates, and on CPU adapters
 * (which do not tune them) the subgroup-matrix ones too, so every adapter
 * that has them reports them.
 */
function benchedTilings(gpu: Gpu, dtype: "f32" | "f16") {
  const tuned = matmulCandidates(gpu, dtype);
  return gpu.adapterProfile.cpu ? [...subgroupMatrixCandidates(gpu, dtype), ...tuned] : tuned;
}
