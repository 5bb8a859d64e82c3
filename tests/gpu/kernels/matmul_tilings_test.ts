/**
 * Every GPU tiling candidate, forced, against f64 references: all three
 * orientations, f32, f16 and bf16, batched, split-K and unsplit, bias and
 * activation epilogues, at shapes chosen per tiling so that each code path
 * of the vec4 kernel runs: interior tiles (vec4 loads, vec4 stores with the
 * fused bias), a last partial k-tile, edge tiles in m and n (checked scalar
 * loads and stores), misaligned operands (scalar loads on interior tiles), and
 * an uneven last split-K slice. Runs through the GPU-like adapter profile, so
 * the candidates are those a GPU with lavapipe's limits would try; those that
 * need more workgroup memory than lavapipe has are checked by a stand-in of
 * the same per-thread block and k-step. Every candidate, the CPU ones too,
 * also runs with one dimension past a tile at a time and at m > n and n > m.
 *
 * Compiling dominates (2–8 s of CPU per kernel on lavapipe), so each GPU
 * candidate compiles 8 kernels, not the 15 of every dtype × orientation ×
 * epilogue: f32 in every orientation, f16 and bf16 in one each and one
 * epilogue into f32 and one into bf16, rotating over the candidates so that
 * every pair (dtype, orientation), (dtype, epilogue) still runs somewhere.
 */
import assert from "node:assert/strict";
import { edgeShapes } from "../../helpers/matmul_edges.ts";
import {
  DTYPES,
  type FloatDType,
  matmul,
  MATMUL_CANDIDATES,
  type MatmulTiling,
  Tensor,
  tilingName,
} from "../../../gpu/mod.ts";
import { tilingFits, tilingKind } from "../../../gpu/kernels/gemm/tilings.ts";
import { launchMatmulInto } from "../../../gpu/kernels/gemm/matmul.ts";
import { gemmSplit } from "../../../gpu/kernels/gemm/gemm.ts";
import { asGpu, gpu, GPU_TEST, withSettings, withTiling } from "../../helpers/gpu.ts";
import { matmulSettings } from "../../../gpu/kernels/gemm/settings.ts";
import { gelu64, matmul64, quantize, uniform } from "../../helpers/reference.ts";
import { assertClose, type Tolerance, tolFor } from "../../helpers/assert.ts";

const ORIENTATIONS = [[false, false], [false, true], [true, false]] as const;

interface Product {
  batch: number;
  m: number;
  n: number;
  k: number;
}

type Orientation = readonly [boolean, boolean];

/** A product's operand dtype and orientation (transA, transB). */
type ProductCase = readonly [FloatDType, Orientation];

/** Every dtype in every orientation. */
const EVERY_CASE: ProductCase[] = DTYPES.flatMap((d) => ORIENTATIONS.map((o) => [d, o] as const));

/**
 * The products tiling number `n` of a list runs. f32 in every orientation:
 * the loads' layout (which index a tile's vec4s run along, and the padded
 * transposed stores) meets the tile's geometry there. f16 and bf16, whose
 * code differs from f32's only in the loads' widening and the stores,
 * in one orientation each, rotating over the tilings, so that every dtype
 * meets every orientation on some tiling (three tilings in a row do it).
 * One kernel each: 5 where the cross product compiles 9.
 */
function casesFor(n: number): ProductCase[] {
  return [
    ...ORIENTATIONS.map((o) => ["f32", o] as const),
    ["f16", ORIENTATIONS[n % 3]],
    ["bf16", ORIENTATIONS[(n + 1) % 3]],
  ];
}

/** Runs op(A)·op(B) with the device's tiling for each of `cases`; compares with f64. */
async function checkProducts(
  dims: Product,
  seed: number,
  label: string,
  cases: readonly ProductCase[],
  tolerance?: Tolerance,
): Promise<void> {
  for (const [dtype, [transA, transB]] of cases) {
    const { batch, m, n, k } = dims;
    const a = quantize(uniform(batch * m * k, seed), dtype);
    const b = quantize(uniform(batch * k * n, seed + 1), dtype);
    const batched = (s: number[]) => (batch > 1 ? [batch, ...s] : s);
    const ta = Tensor.from(a, batched(transA ? [k, m] : [m, k]), { dtype });
    const tb = Tensor.from(b, batched(transB ? [n, k] : [k, n]), { dtype });
    const c = matmul(ta, tb, { transA, transB });
    const expected = matmul64(a, b, { ...dims, transA, transB });
    const what = `${label} ${dtype} ${transA ? "t" : "n"}${transB ? "t" : "n"} ${
      JSON.stringify(dims)
    }`;
    assertClose(await c.read(), expected, tolerance ?? tolFor(dtype, k), what);
    [ta, tb, c].forEach((t) => t.dispose());
  }
}

/**
 * x·Wᵀ + bias through an activation, as one kernel (the epilogue linear and
 * conv use; gelu is the kernels' tanh form), against f64. Output in `out`
 * (default f32), bias in x's dtype.
 */
async function checkEpilogue(
  dims: { m: number; n: number; k: number },
  epilogue: { activation: "relu" | "gelu"; dtype: FloatDType; out?: FloatDType },
  label: string,
): Promise<void> {
  const { m, n, k } = dims;
  const { activation, dtype, out = "f32" } = epilogue;
  {
    const x = quantize(uniform(m * k, 5), dtype);
    const w = quantize(uniform(n * k, 6), dtype);
    const bias = quantize(uniform(n, 7), dtype);
    const tx = Tensor.from(x, [m, k], { dtype }), tw = Tensor.from(w, [n, k], { dtype });
    const tb = Tensor.from(bias, [n], { dtype }), y = Tensor.empty([m, n], out, gpu);
    const problem = {
      batch: 1,
      m,
      n,
      k,
      a: { batch: 0, row: k, col: 1 },
      b: { batch: 0, row: 1, col: k },
    };
    launchMatmulInto(problem, tx, tw, y, { bias: tb, activation });
    const product = matmul64(x, w, { batch: 1, m, n, k, transA: false, transB: true });
    const act = activation === "relu" ? (v: number) => Math.max(v, 0) : gelu64;
    const expected = product.map((v, i) => act(v + bias[i % n]));
    const what = `${label} bias ${activation} ${dtype}>${out} ${m}x${n}x${k}`;
    assertClose(await y.read(), expected, tolFor(out, k), what);
    [tx, tw, tb, y].forEach((t) => t.dispose());
  }
}

/** Runs `fn` with `tiling` forced and split-K aiming at `splitTarget` workgroups (0: never split). */
async function forced(
  tiling: MatmulTiling,
  splitTarget: number,
  fn: () => Promise<void>,
): Promise<void> {
  await withTiling(
    tiling,
    () => withSettings(matmulSettings.of(gpu), { splitKWorkgroups: splitTarget }, fn),
  );
}

/**
 * The GPU candidates (vec4 and blocked), each replaced, where it needs more
 * workgroup memory than the device has, by a stand-in with the same
 * per-thread block and k-step over a 64×64 tile; and a small tiling whose
 * loads are guarded (fewer vec4s per tile than threads), as an initGpu
 * caller may give.
 */
function candidatesToCheck(): MatmulTiling[] {
  const limits = gpu.adapterProfile.limits;
  const candidates = MATMUL_CANDIDATES.filter((t) => tilingKind(t).forGpus).map((t) => {
    if (tilingFits(t, "f32", limits)) return t;
    const standIn = { ...t, wgx: 64 / t.tn, wgy: 64 / t.tm };
    assert.ok(tilingFits(standIn, "f32", limits), `stand-in of ${tilingName(t)} fits`);
    return standIn;
  });
  return [...candidates, { variant: "vec4", tm: 4, tn: 4, wgx: 8, wgy: 8, tk: 4 }];
}

Deno.test({
  name:
    "matmul tilings: every GPU candidate, forced, matches f64 at edge, interior, misaligned and split shapes",
  ...GPU_TEST,
  async fn() {
    await asGpu(async () => {
      const tilings = candidatesToCheck();
      assert.ok(
        tilings.some((t) => t.tk === 32) && tilings.some((t) => t.tn === 12),
        "k-step 32 and 8×12 covered",
      );
      // Each kernel compiles in 2–8 s of CPU on lavapipe (the 8×16 blocks the longest): a
      // tiling compiles 8 (9 for the first), where the cross product of dtypes, orientations
      // and epilogues would compile 15. See casesFor for the products.
      for (const [i, tiling] of tilings.entries()) {
        const bm = tiling.tm * tiling.wgy, bn = tiling.tn * tiling.wgx, tk = tiling.tk;
        const name = tilingName(tiling), cases = casesFor(i);
        const half = i % 2 === 0 ? "bf16" : "f16"; // the split's operands, by turns
        await forced(tiling, 0, async () => {
          // Interior tile (0, 0) with vec4 loads and stores, edge tiles in m and n, a partial last k-tile, batched.
          await checkProducts({ batch: 2, m: bm + 4, n: bn + 4, k: 2 * tk + 4 }, 1, name, cases);
          // Odd sizes: misaligned strides (scalar loads on the interior tile), n not a multiple of 4 (scalar stores).
          await checkProducts({ batch: 1, m: 129, n: 385, k: 33 }, 2, name, cases);
          // bf16: odd n, so two threads store the two halves of one word.
          const f32AndBf16 = cases.filter(([d]) => d !== "f16");
          await checkProducts({ batch: 1, m: 383, n: 7, k: 1 }, 3, name, f32AndBf16);
          await checkProducts({ batch: 1, m: 1, n: 1, k: 1 }, 4, name, f32AndBf16);
          // The fused epilogue: vec4 stores with the bias per column group, and scalar edge
          // stores; into f32 (from f32 with GELU, or from f16 with ReLU, by turns) and bf16.
          const toF32 = i % 2 === 0
            ? { activation: "gelu", dtype: "f32" } as const
            : { activation: "relu", dtype: "f16" } as const;
          // bf16 results: whole-word pairs from interior vec4 stores, single halves at the edges.
          const toBf16 = { activation: "gelu", dtype: "bf16", out: "bf16" } as const;
          for (const epilogue of [toF32, toBf16]) {
            await checkEpilogue({ m: bm + 4, n: bn + 4, k: tk + 4 }, epilogue, name);
            await checkEpilogue({ m: 7, n: 33, k: 9 }, epilogue, name);
          }
          // bf16 operands into an f32 result (a weight gradient for an f32 master), once.
          if (i === 0) {
            const dims = { m: bm + 4, n: bn + 4, k: tk + 4 };
            await checkEpilogue(dims, { activation: "relu", dtype: "bf16", out: "f32" }, name);
          }
        });
        await forced(tiling, 256, async () => {
          for (const [m, n, k] of [[33, 7, 4092], [bm, bn, 520]]) {
            assert.ok(
              gemmSplit(gpu, tiling, { m, n, k }, 1).slices > 1,
              `${name} splits ${m}x${n}x${k}`,
            );
          }
          // Split-K, f32 partial sums (the f32 kernels above): one tile over K = 4096 − 4
          // (uneven last slice), and interior vec4 tiles over two slices of uneven length.
          const label = `${name} split`, tn = [true, false] as const;
          await checkProducts({ batch: 1, m: 33, n: 7, k: 4092 }, 5, label, [["f32", [
            false,
            false,
          ]]]);
          await checkProducts(
            { batch: 1, m: bm, n: bn, k: 520 },
            6,
            label,
            cases.filter(([d]) => d === "f32"),
          );
          // f16 or bf16 operands (by turns) into f32 partials, summed in f32 and rounded once.
          await checkProducts({ batch: 1, m: 33, n: 7, k: 4092 }, 5, label, [[half, tn]]);
          await checkProducts({ batch: 1, m: bm, n: bn, k: 520 }, 6, label, [[half, tn]]);
        });
      }
    });
  },
});

Deno.test({
  name: "matmul tilings: every candidate (CPU and GPU), forced, matches f64 with one " +
    "dimension past a tile at a time, all three, and at m > n and n > m",
  ...GPU_TEST,
  async fn() {
    const cpu = MATMUL_CANDIDATES.filter((t) => !tilingKind(t).forGpus);
    const each = async (tiling: MatmulTiling, cases: readonly ProductCase[]) => {
      await forced(tiling, 0, async () => {
        for (const [n, { dims, guard }] of edgeShapes(tiling).entries()) {
          await checkProducts(dims, 40 + n, `${tilingName(tiling)} (${guard})`, cases);
        }
      });
    };
    // The CPU tilings compile one kernel per dtype whatever the orientation: every case.
    for (const tiling of cpu) await each(tiling, EVERY_CASE);
    // The GPU ones the kernels of the test above.
    await asGpu(async () => {
      for (const [i, tiling] of candidatesToCheck().entries()) await each(tiling, casesFor(i));
    });
  },
});

Deno.test("matmul tilings: every candidate has its own name (the k-step included) and a kind record", () => {
  const names = MATMUL_CANDIDATES.map(tilingName);
  assert.equal(new Set(names).size, names.length, names.join(", "));
  assert.ok(names.includes("vec4 128x256x16 t8x16") && names.includes("vec4 128x256x8 t8x16"));
  for (const t of MATMUL_CANDIDATES) {
    assert.equal(tilingKind(t).shapeProblem(t), null, tilingName(t));
  }
});

Deno.test({
  name:
    "matmul tilings: vec4 with f16 chunked sums (f16 workgroup tiles) matches f64 on interior and edge tiles",
  ...GPU_TEST,
  async fn() {
    const tiling = MATMUL_CANDIDATES.find((t) => t.variant === "vec4" && t.tm === 4)!;
    // Inside asGpu: its settings are the GPU-like profile's, made afresh.
    await asGpu(() =>
      withSettings(matmulSettings.of(gpu), { f16Accumulation: "chunked" }, () =>
        forced(
          tiling,
          0,
          () =>
            checkProducts(
              { batch: 2, m: 68, n: 68, k: 36 },
              8,
              `${tilingName(tiling)} chunked`,
              ORIENTATIONS.map((o) => ["f16", o] as const),
              // Runs of 8 summed in f16: a random walk of 8·2⁻¹¹-sized errors over Σ|ab| ≈ 9 (the
              // stated bound, f16_accumulation_test, is 0.035 there); a misplaced element is off by ~1.
              { atol: 0.02, rtol: 2e-3 },
            ),
        ))
    );
  },
});
