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
 * the same per-thread block and k-step.
 */
import assert from "node:assert/strict";
import {
  DTYPES,
  type FloatDType,
  matmul,
  MATMUL_CANDIDATES,
  type MatmulTiling,
  Tensor,
  tilingName,
} from "../gpu/mod.ts";
import { tilingFits, tilingKind } from "../gpu/kernels/gemm/tilings.ts";
import { dispatchMatmul } from "../gpu/kernels/gemm/matmul.ts";
import { gemmSplit } from "../gpu/kernels/gemm/gemm.ts";
import { asGpu, gpu, GPU_TEST, withSettings, withTiling } from "./_gpu.ts";
import { matmulSettings } from "../gpu/kernels/gemm/settings.ts";
import { gelu64, matmul64, quantize, uniform } from "./_reference.ts";
import { assertClose, TOL, type Tolerance } from "./_assert.ts";

/** As matmul_test: error may grow like √K times the unit roundoff. */
function tolFor(dtype: FloatDType, k: number): Tolerance {
  const t = TOL[dtype];
  return { atol: t.atol * Math.max(1, Math.sqrt(k) / 4), rtol: t.rtol };
}

const ORIENTATIONS = [[false, false], [false, true], [true, false]] as const;

interface Product {
  batch: number;
  m: number;
  n: number;
  k: number;
}

/**
 * Runs op(A)·op(B) with the device's tiling in each of `orientations`
 * (default all three) and `dtypes` (default every float dtype); compares with f64.
 */
async function checkProducts(
  dims: Product,
  seed: number,
  label: string,
  only: {
    tolerance?: Tolerance;
    dtypes?: readonly FloatDType[];
    orientations?: readonly (readonly [boolean, boolean])[];
  } = {},
): Promise<void> {
  for (const dtype of only.dtypes ?? DTYPES) {
    for (const [transA, transB] of only.orientations ?? ORIENTATIONS) {
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
      assertClose(await c.read(), expected, only.tolerance ?? tolFor(dtype, k), what);
      [ta, tb, c].forEach((t) => t.dispose());
    }
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
    dispatchMatmul(problem, tx, tw, y, { bias: tb, activation });
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
      // Each kernel compiles in about a second on lavapipe (bf16 ones in two): the checks
      // reuse few (3 orientations × 3 dtypes, an epilogue per dtype, split f16 and bf16 in one).
      for (const tiling of tilings) {
        const bm = tiling.tm * tiling.wgy, bn = tiling.tn * tiling.wgx, tk = tiling.tk;
        const name = tilingName(tiling);
        await forced(tiling, 0, async () => {
          // Interior tile (0, 0) with vec4 loads and stores, edge tiles in m and n, a partial last k-tile, batched.
          await checkProducts({ batch: 2, m: bm + 4, n: bn + 4, k: 2 * tk + 4 }, 1, name);
          // Odd sizes: misaligned strides (scalar loads on the interior tile), n not a multiple of 4 (scalar stores).
          await checkProducts({ batch: 1, m: 129, n: 385, k: 33 }, 2, name);
          // bf16: odd n, so two threads store the two halves of one word.
          await checkProducts({ batch: 1, m: 383, n: 7, k: 1 }, 3, name, {
            dtypes: ["f32", "bf16"],
          });
          await checkProducts({ batch: 1, m: 1, n: 1, k: 1 }, 4, name, { dtypes: ["f32", "bf16"] });
          // The fused epilogue: vec4 stores with the bias per column group, and scalar edge stores.
          await checkEpilogue({ m: bm + 4, n: bn + 4, k: tk + 4 }, {
            activation: "gelu",
            dtype: "f32",
          }, name);
          await checkEpilogue({ m: 7, n: 33, k: 9 }, { activation: "relu", dtype: "f16" }, name);
          // bf16 results: whole-word pairs from interior vec4 stores, single halves at the edges.
          const bf16 = { dtype: "bf16", out: "bf16" } as const;
          await checkEpilogue({ m: bm + 4, n: bn + 4, k: tk + 4 }, {
            activation: "gelu",
            ...bf16,
          }, name);
          await checkEpilogue({ m: 7, n: 33, k: 9 }, { activation: "gelu", ...bf16 }, name);
          // bf16 operands into an f32 result (a weight gradient for an f32 master), once.
          if (tiling === tilings[0]) {
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
          // Split-K, f32 partial sums: one tile over K = 4096 − 4 (uneven last slice), and
          // interior vec4 tiles over two slices of uneven length.
          await checkProducts({ batch: 1, m: 33, n: 7, k: 4092 }, 5, `${name} split`, {
            dtypes: ["f32"],
          });
          // bf16 (the kernel of the next check): slices summed in f32, rounded once into bf16.
          await checkProducts({ batch: 1, m: 33, n: 7, k: 4092 }, 5, `${name} split`, {
            dtypes: ["bf16"],
            orientations: [[true, false]],
          });
          await checkProducts({ batch: 1, m: bm, n: bn, k: 520 }, 6, `${name} split`, {
            orientations: [[true, false]],
          });
          await checkProducts({ batch: 1, m: bm, n: bn, k: 520 }, 6, `${name} split`, {
            dtypes: ["f32"],
            orientations: [[false, false], [false, true]],
          });
        });
      }
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
            checkProducts({ batch: 2, m: 68, n: 68, k: 36 }, 8, `${tilingName(tiling)} chunked`, {
              dtypes: ["f16"],
              // Runs of 8 summed in f16: a random walk of 8·2⁻¹¹-sized errors over Σ|ab| ≈ 9 (the
              // stated bound, f16_accumulation_test, is 0.035 there); a misplaced element is off by ~1.
              tolerance: { atol: 0.02, rtol: 2e-3 },
            }),
        ))
    );
  },
});
