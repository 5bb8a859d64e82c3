/**
 * The parts of `examples/gpu_check.ts`, each on one device: what it prints is
 * one JSON object per line on stdout, written as each result is known, so a
 * part cut short keeps what finished. Every part stops starting new work at
 * its deadline (the driver kills it a little after).
 *
 * - `adapter`: the adapter, its features, subgroup sizes, subgroup-matrix
 *   configs and the limits kernels are chosen by;
 * - `correct`: every subgroup-matrix candidate once against an f64 reference
 *   at three shapes: each matmul tiling (one orientation per shape), conv2d
 *   forward and backward on each, and the attention plans with a
 *   subgroup-matrix forward and backward;
 * - `matmul`: f16 products of 4096³ (small: 256³) in each orientation with
 *   every tiling this adapter offers (SIMT and subgroup-matrix; a CPU adapter
 *   only the default and the subgroup-matrix ones), TFLOP/s, and the best of
 *   each kind side by side;
 * - `gpt`: the nanoGPT-size GPT's step in f32 and AMP (bench gpt's), with the
 *   tuner's picks and `gpu.profile()`'s top kernels.
 *
 * The f64 references are the test suite's (tests/helpers/reference.ts,
 * tests/helpers/attention_reference.ts, tests/helpers/conv_reference.ts): independent of
 * every kernel.
 */
import {
  backward,
  conv2d,
  fusedCausalAttentionPacked,
  type Gpu,
  initGpu,
  Tensor,
} from "../../mod.ts";
import {
  type AttentionPlan,
  type Backend,
  DeviceArray,
  type MatmulTiling,
  tilingName,
} from "../../gpu/mod.ts";
import { DEFAULT_TILING, matmulSettings } from "../../gpu/kernels/gemm/settings.ts";
import { matmulCandidates, subgroupMatrixCandidates } from "../../gpu/kernels/gemm/candidates.ts";
import { launchMatmulInto } from "../../gpu/kernels/gemm/matmul.ts";
import { denseProblem, type MatmulOrientation } from "../../gpu/kernels/gemm/matmul_class.ts";
import { attentionSettings } from "../../gpu/kernels/attention/settings.ts";
import { DEFAULT_ATTENTION_PLAN } from "../../gpu/kernels/attention/plans.ts";
import { attentionMatrixFor } from "../../gpu/kernels/attention/flash_attention_subgroup_matrix.ts";
import { matrixBackwardsFor } from "../../gpu/kernels/attention/flash_attention_subgroup_matrix_backward.ts";
import { matmul64, quantize, uniform } from "../../tests/helpers/reference.ts";
import { causalAttentionWithGrads64 } from "../../tests/helpers/attention_reference.ts";
import { conv2d64, type ConvCase } from "../../tests/helpers/conv_reference.ts";
import { gpuTimed, resolveSize } from "./harness.ts";
import { holdTuningForBench, tuneForBench, type TuningReport } from "./tuning.ts";
import { benchGpt } from "./gpt.ts";

/** The parts, in the order the driver runs them. */
export const PARTS = ["adapter", "correct", "matmul", "gpt"] as const;
/** One part's name. */
export type Part = (typeof PARTS)[number];

/** What each part is given. */
export interface PartContext {
  backend: Backend;
  size: "auto" | "real" | "small";
  /** `performance.now()` after which no new work starts. */
  deadline: number;
}

/** Prints one result line (stdout carries only these). */
function emit(part: Part, ctx: PartContext, fields: Record<string, unknown>): void {
  console.log(JSON.stringify({ check: "gpu", part, backend: ctx.backend, ...fields }));
}

/** True (and says so once) when the part is out of time. */
function outOfTime(part: Part, ctx: PartContext): boolean {
  if (performance.now() < ctx.deadline) return false;
  emit(part, ctx, { status: "out of time", note: "the rest of this part was not started" });
  return true;
}

/** The adapter and what the library reads of it. */
async function adapterPart(ctx: PartContext): Promise<void> {
  const gpu = await initGpu({ backend: ctx.backend, tuning: "off", matmulTiling: "default" });
  const info = gpu.adapterInfo as GPUAdapterInfo & Record<string, unknown>;
  const p = gpu.adapterProfile;
  emit("adapter", ctx, {
    adapter: gpu.adapterName,
    vendor: info.vendor,
    architecture: info.architecture,
    features: [...gpu.device.features].sort(),
    f16: gpu.f16,
    subgroups: gpu.subgroups,
    subgroupMinSize: info.subgroupMinSize ?? null,
    subgroupMaxSize: info.subgroupMaxSize ?? null,
    subgroupMatrixConfigs: gpu.subgroupMatrixConfigs,
    cpuAdapter: p.cpu,
    limits: p.limits,
    deno: Deno.version.deno,
  });
  gpu.destroy();
}

/**
 * The largest |got − want| and the largest ratio of it to its bound
 * atol + rtol·|scale| (scale: `want`, unless given): at most 1 passes; NaN fails.
 */
function worst(
  got: ArrayLike<number>,
  want: ArrayLike<number>,
  atol: number,
  rtol: number,
  scale: ArrayLike<number> = want,
) {
  let ratio = 0, error = 0;
  for (let i = 0; i < want.length; i++) {
    const e = Math.abs(got[i] - want[i]), r = e / (atol + rtol * Math.abs(scale[i]));
    if (!(r <= ratio)) ratio = Number.isNaN(r) ? Infinity : r;
    if (!(e <= error)) error = Number.isNaN(e) ? Infinity : e;
  }
  return { maxError: error, ratio, ok: ratio <= 1 };
}

/** Three products: odd sizes (every edge), aligned, and a long reduction; one orientation each. */
const MATMUL_SHAPES: [number, number, number, MatmulOrientation][] = [
  [33, 70, 50, "nn"],
  [128, 256, 96, "nt"],
  [200, 136, 520, "tn"],
];

/** f16 A·B on one tiling against f64 (f32 results: f16 inputs and products are exact in f32). */
async function checkMatmul(gpu: Gpu, tiling: MatmulTiling, shape: (typeof MATMUL_SHAPES)[0]) {
  const [m, n, k, orientation] = shape;
  const a = quantize(uniform(m * k, 1, -1, 1), "f16"),
    b = quantize(uniform(k * n, 2, -1, 1), "f16");
  const transA = orientation === "tn", transB = orientation === "nt";
  const dims = { batch: 1, m, n, k, transA, transB };
  const want = matmul64(a, b, dims);
  const magnitude = matmul64(a.map(Math.abs), b.map(Math.abs), dims);
  const da = Tensor.from(a, [a.length], { dtype: "f16", gpu });
  const db = Tensor.from(b, [b.length], { dtype: "f16", gpu });
  const dc = DeviceArray.empty([m * n], "f32", gpu);
  launchMatmulInto(denseProblem({ batch: 1, m, n, k }, orientation), da, db, dc, {}, tiling);
  const got = await dc.read();
  for (const x of [da, db, dc]) x.dispose();
  // f16 products are exact in f32; k f32 additions err by at most k·2⁻²⁴ of Σ|a||b| (twice: slack).
  return worst(got, want, 2 ** -24, 2 * k * 2 ** -24, magnitude);
}

/** Three convolutions: padded 3×3, strided and grouped, 1×1 over many positions. */
const CONV_SHAPES: ConvCase[] = [
  { n: 2, c: 8, h: 9, w: 9, o: 16, k: [3, 3], padding: [1, 1], bias: true },
  { n: 1, c: 16, h: 13, w: 11, o: 8, k: [3, 3], stride: [2, 2], padding: [1, 1], groups: 2 },
  { n: 4, c: 32, h: 8, w: 8, o: 32, k: [1, 1] },
];

/** conv2d forward and backward in f16 with every product on `tiling`, against f64. */
async function checkConv(gpu: Gpu, tiling: MatmulTiling, t: ConvCase) {
  const settings = matmulSettings.of(gpu);
  const saved = { tiling: settings.tiling, classes: [...settings.classTilings] };
  settings.tiling = tiling;
  settings.classTilings.clear();
  try {
    const cg = t.c / (t.groups ?? 1);
    const x = quantize(uniform(t.n * t.c * t.h * t.w, 3), "f16");
    const w = quantize(uniform(t.o * cg * t.k[0] * t.k[1], 4, -0.5, 0.5), "f16");
    const b = t.bias ? quantize(uniform(t.o, 5), "f16") : null;
    const { shape } = conv2d64(x, w, b, null, t);
    const dy = quantize(uniform(shape.reduce((p, q) => p * q, 1), 6), "f16");
    const want = conv2d64(x, w, b, dy, t);
    const tx = Tensor.from(x, [t.n, t.c, t.h, t.w], { dtype: "f16", requiresGrad: true });
    const tw = Tensor.from(w, [t.o, cg, ...t.k], { dtype: "f16", requiresGrad: true });
    const tb = b && Tensor.from(b, [t.o], { dtype: "f16" });
    const y = conv2d(tx, tw, { stride: t.stride, padding: t.padding, groups: t.groups, bias: tb });
    backward(y, { gradient: Tensor.from(dy, shape, { dtype: "f16" }) });
    const [gy, gx, gw] = await Promise.all([y.read(), tx.grad!.read(), tw.grad!.read()]);
    for (const a of [tx, tw, tb, y]) a?.dispose();
    // f16 results of f32 sums: half an f16 ulp (2⁻¹¹ relative) and the sums' f16 inputs.
    const checks = [
      worst(gy, want.y, 2e-3, 2e-3),
      worst(gx, want.dx, 2e-3, 2e-3),
      worst(gw, want.dw, 3e-2, 3e-3),
    ];
    return checks.reduce((a, c) => (c.ratio > a.ratio ? c : a));
  } finally {
    settings.tiling = saved.tiling;
    for (const [key, value] of saved.classes) settings.classTilings.set(key, value);
  }
}

/** Three attentions (head size 64): one block, edges over several blocks, a long sequence. */
const ATTENTION_SHAPES = [
  { b: 2, t: 33, h: 2, d: 64 },
  { b: 1, t: 130, h: 3, d: 64 },
  { b: 1, t: 256, h: 2, d: 64 },
];

/** Packed f16 attention forward and backward under `plan`, against f64. */
async function checkAttention(gpu: Gpu, plan: AttentionPlan, dims: (typeof ATTENTION_SHAPES)[0]) {
  const { plans } = attentionSettings.of(gpu);
  const saved = plans.get("f16");
  plans.set("f16", plan);
  try {
    const n = dims.b * dims.t * dims.h * dims.d, c = dims.h * dims.d;
    const [q, k, v, g] = [1, 2, 3, 4].map((s) => quantize(uniform(n, 10 + s, -2, 2), "f16"));
    const want = causalAttentionWithGrads64(q, k, v, g, dims);
    const rows = dims.b * dims.t, packed = new Float64Array(rows * 3 * c);
    [q, k, v].forEach((x, part) => {
      for (let r = 0; r < rows; r++) packed.set(x.subarray(r * c, (r + 1) * c), (3 * r + part) * c);
    });
    const qkv = Tensor.from(packed, [dims.b, dims.t, 3 * c], { dtype: "f16", requiresGrad: true });
    const o = fusedCausalAttentionPacked(qkv, { heads: dims.h });
    backward(o, { gradient: Tensor.from(g, [dims.b, dims.t, c], { dtype: "f16" }) });
    const [go, gqkv] = await Promise.all([o.read(), qkv.grad!.read()]);
    for (const a of [qkv, o]) a.dispose();
    const third = (part: number) =>
      Float64Array.from(
        { length: rows * c },
        (_, i) => gqkv[(3 * Math.floor(i / c) + part) * c + (i % c)],
      );
    // As tests/gpu/kernels/attention_subgroup_matrix_backward_test.ts: f16 roundings of p, dS and the outputs.
    const checks = [
      worst(go, want.o, 4e-3, 4e-3),
      ...["dq", "dk", "dv"].map((name, part) =>
        worst(third(part), want[name as "dq" | "dk" | "dv"], 4e-3, 4e-3)
      ),
    ];
    return checks.reduce((a, c) => (c.ratio > a.ratio ? c : a));
  } finally {
    if (saved) plans.set("f16", saved);
    else plans.delete("f16");
  }
}

/** The subgroup-matrix attention plans: the forward with the SIMT backward, and with each matrix backward. */
function matrixPlans(gpu: Gpu): { name: string; plan: AttentionPlan }[] {
  const matrix = attentionMatrixFor(gpu, 64, "f16");
  if (!matrix) return [];
  const shape = (m: { subgroups: number; bc: number }) =>
    `${m.subgroups} subgroups, ${m.bc} per step`;
  return [
    {
      name: `forward (${shape(matrix)}), SIMT backward`,
      plan: { ...DEFAULT_ATTENTION_PLAN, matrix },
    },
    ...matrixBackwardsFor(gpu, 64, "f16").slice(0, 2).map((matrixBackward) => ({
      name: `forward and backward (${shape(matrixBackward)})`,
      plan: { ...DEFAULT_ATTENTION_PLAN, matrix, matrixBackward },
    })),
  ];
}

/** Every subgroup-matrix candidate against f64 (see the module comment). */
async function correctPart(ctx: PartContext): Promise<void> {
  const gpu = await initGpu({ backend: ctx.backend, tuning: "off", matmulTiling: "default" });
  try {
    const tilings = gpu.f16 ? subgroupMatrixCandidates(gpu, "f16") : [];
    if (tilings.length === 0) {
      emit("correct", ctx, { status: "unavailable", note: "no f16→f32 subgroup matrices here" });
      return;
    }
    const run = async (
      kernel: string,
      candidate: string,
      shape: string,
      check: () => Promise<ReturnType<typeof worst>>,
    ) => {
      if (outOfTime("correct", ctx)) return false;
      try {
        emit("correct", ctx, { kernel, candidate, shape, ...(await check()) });
      } catch (e) {
        emit("correct", ctx, {
          kernel,
          candidate,
          shape,
          ok: false,
          error: (e as Error).message.slice(0, 300),
        });
      }
      return true;
    };
    // Small (a CPU adapter, which compiles each such kernel in seconds): one shape of each
    // candidate, and the convolutions on the first tiling only.
    const small = resolveSize(gpu, ctx.size) === "small";
    const shapes = <T>(all: T[]) => small ? all.slice(0, 1) : all;
    for (const [n, t] of tilings.entries()) {
      for (const s of shapes(MATMUL_SHAPES)) {
        if (
          !await run(
            "matmul",
            tilingName(t),
            `${s[0]}x${s[1]}x${s[2]} ${s[3]}`,
            () => checkMatmul(gpu, t, s),
          )
        ) return;
      }
      if (small && n > 0) continue;
      for (const s of shapes(CONV_SHAPES)) {
        const label = `${s.n}x${s.c}x${s.h}x${s.w}→${s.o} k${s.k[0]} s${s.stride?.[0] ?? 1} g${
          s.groups ?? 1
        }`;
        if (!await run("conv2d", tilingName(t), label, () => checkConv(gpu, t, s))) return;
      }
    }
    for (const { name, plan } of matrixPlans(gpu)) {
      for (const d of shapes(ATTENTION_SHAPES)) {
        const label = `B${d.b} T${d.t} H${d.h} D${d.d} packed`;
        if (!await run("attention", name, label, () => checkAttention(gpu, plan, d))) return;
      }
    }
  } finally {
    gpu.destroy();
  }
}

/** f16 products at 4096³ (small: 256³) per orientation and tiling, and the best of each kind. */
async function matmulPart(ctx: PartContext): Promise<void> {
  const gpu = await initGpu({ backend: ctx.backend, tuning: "off", matmulTiling: "default" });
  try {
    const size = resolveSize(gpu, ctx.size), side = size === "real" ? 4096 : 256;
    // A CPU adapter (small) times the default tiling against one subgroup-matrix candidate:
    // each candidate's kernels compile there in seconds, and its figures say nothing of a GPU.
    const cpu = gpu.adapterProfile.cpu;
    const matrices = (gpu.f16 ? subgroupMatrixCandidates(gpu, "f16") : []).slice(
      0,
      cpu ? 1 : undefined,
    );
    const dtype = gpu.f16 ? "f16" : "f32";
    const simt = cpu
      ? [DEFAULT_TILING]
      : matmulCandidates(gpu, dtype).filter((t) => t.variant !== "subgroup-matrix");
    const a = DeviceArray.filled([side * side], 0.5, dtype, gpu);
    const b = DeviceArray.filled([side * side], 0.25, dtype, gpu);
    const c = DeviceArray.empty([side * side], dtype, gpu);
    const flops = 2 * side ** 3;
    for (const orientation of ["nn", "nt", "tn"] as const) {
      const best = { simt: 0, matrix: 0 };
      for (const tiling of [...matrices, ...simt]) {
        if (outOfTime("matmul", ctx)) return;
        const kind = tiling.variant === "subgroup-matrix" ? "matrix" : "simt";
        const problem = denseProblem({ batch: 1, m: side, n: side, k: side }, orientation);
        try {
          const t = await gpuTimed(
            gpu,
            size === "real" ? 5 : 2,
            () => launchMatmulInto(problem, a, b, c, {}, tiling),
          );
          const tflops = flops / (t.ms / 1000) / 1e12;
          best[kind] = Math.max(best[kind], tflops);
          emit("matmul", ctx, {
            dtype,
            shape: `${side}³`,
            orientation,
            tiling: tilingName(tiling),
            kind,
            ms: t.ms,
            tflops,
            timing: t.timing,
          });
        } catch (e) {
          emit("matmul", ctx, {
            dtype,
            orientation,
            tiling: tilingName(tiling),
            kind,
            error: (e as Error).message.slice(0, 300),
          });
        }
      }
      emit("matmul", ctx, {
        dtype,
        shape: `${side}³`,
        orientation,
        summary: true,
        bestSimtTflops: best.simt,
        bestMatrixTflops: best.matrix || null,
        matrixSpeedup: best.matrix ? best.matrix / best.simt : null,
      });
    }
    for (const x of [a, b, c]) x.dispose();
  } finally {
    gpu.destroy();
  }
}

/** The GPT step in f32 and AMP (bench gpt's), with the picks and the top kernels. */
async function gptPart(ctx: PartContext): Promise<void> {
  // A CPU adapter runs the default kernels: tuning takes minutes there and says nothing of a GPU.
  const probe = await initGpu({
    backend: ctx.backend,
    tuning: "off",
    matmulTiling: "default",
    setDefault: false,
  });
  const cpu = probe.adapterProfile.cpu;
  probe.destroy();
  const gpu = cpu
    ? await initGpu({ backend: ctx.backend, tuning: "off", matmulTiling: "default" })
    : await initGpu({ backend: ctx.backend, tuning: "lazy" });
  try {
    let tuning: TuningReport = {
      seconds: 0,
      matmul: [],
      attention: [],
      retune: false,
      shapeSeconds: 0,
    };
    if (!cpu) {
      holdTuningForBench(gpu);
      tuning = await tuneForBench(gpu, false);
    }
    if (outOfTime("gpt", ctx)) return;
    // bench gpt's steps: 10 timed steps at real size, 2 at small.
    const steps = resolveSize(gpu, ctx.size) === "real" ? 100 : 20;
    const options = { steps, repeats: 10, size: ctx.size, tuning };
    const results = await benchGpt(gpu, options, ["f32", "amp", "amp captured"]);
    for (const r of results) emit("gpt", ctx, r);
  } finally {
    gpu.destroy();
  }
}

/** Runs `part` on `ctx`'s backend. */
export function runPart(part: Part, ctx: PartContext): Promise<void> {
  return { adapter: adapterPart, correct: correctPart, matmul: matmulPart, gpt: gptPart }[part](
    ctx,
  );
}
