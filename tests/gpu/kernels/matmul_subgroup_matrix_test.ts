/**
 * Every subgroup-matrix (tensor-core) matmul candidate of the adapter,
 * forced, against f64: the three orientations (the transposed operands are
 * read by col_major matrix loads), batched, split-K and unsplit (K = 4096),
 * bias/activation epilogues, f16 and f32 results, at shapes that run each
 * path of the kernel: interior tiles (vec4 staging and stores), edge tiles
 * (zero-filled staging, checked stores), misaligned operands (scalar staging
 * on interior tiles), a partial last k-tile, single rows and columns.
 *
 * Needs an adapter with an f16→f32 subgroup-matrix config: the Dawn backend
 * (HALFSTEP_BACKEND=dawn; Mesa 26's lavapipe lists 8×8×8). Elsewhere the
 * tests are ignored, saying so in their names.
 */
import assert from "node:assert/strict";
import { type MatmulTiling, Tensor, tilingName } from "../../../gpu/mod.ts";
import { launchMatmulInto } from "../../../gpu/kernels/gemm/matmul.ts";
import { gemmSplit } from "../../../gpu/kernels/gemm/gemm.ts";
import { denseProblem, type MatmulOrientation } from "../../../gpu/kernels/gemm/matmul_class.ts";
import {
  matmulCandidates,
  subgroupMatrixCandidates,
} from "../../../gpu/kernels/gemm/candidates.ts";
import { matmulSettings } from "../../../gpu/kernels/gemm/settings.ts";
import { subgroupMatrixTilings } from "../../../gpu/kernels/gemm/gemm_subgroup_matrix.ts";
import { f16MatrixConfig } from "../../helpers/internals.ts";
import {
  asGpu,
  dispatchedKernelsAsync,
  gpu,
  GPU_TEST,
  withSettings,
  withTiling,
} from "../../helpers/gpu.ts";
import { gelu64, matmul64, quantize, uniform } from "../../helpers/reference.ts";
import { assertClose, tolFor } from "../../helpers/assert.ts";
import { requireMatricesOnDawn } from "../../helpers/dawn_pass.ts";
import { edgeShapes } from "../../helpers/matmul_edges.ts";

const config = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);
/** Appended to each test's name where it cannot run. */
const CANNOT_RUN = config ? "" : " (IGNORED: this adapter has no f16→f32 subgroup-matrix " +
  "config; run on the Dawn backend, HALFSTEP_BACKEND=dawn)";
const DAWN_TEST = { ...GPU_TEST, ignore: !config } as const;

const ORIENTATIONS: readonly MatmulOrientation[] = ["nn", "nt", "tn"];

interface Check {
  batch?: number;
  m: number;
  n: number;
  k: number;
  out: "f32" | "f16";
  /** A bias of f16 and an activation after it (x·Wᵀ + b, as linear). */
  epilogue?: "relu" | "gelu";
}

/** op(A)·op(B) in `orientation` with the device's forced tiling, against f64. */
async function check(c: Check, orientation: MatmulOrientation, seed: number, label: string) {
  const { m, n, k, out } = c, batch = c.batch ?? 1;
  const a = quantize(uniform(batch * m * k, seed), "f16");
  const b = quantize(uniform(batch * k * n, seed + 1), "f16");
  const bias = quantize(uniform(n, seed + 2), "f16");
  const problem = denseProblem({ batch, m, n, k }, orientation);
  const ta = Tensor.from(a, [a.length], { dtype: "f16" });
  const tb = Tensor.from(b, [b.length], { dtype: "f16" });
  const tbias = Tensor.from(bias, [n], { dtype: "f16" });
  const tc = Tensor.empty([batch * m * n], out, gpu);
  const epilogue = c.epilogue ? { bias: tbias, activation: c.epilogue } : {};
  launchMatmulInto(problem, ta, tb, tc, epilogue);
  const product = matmul64(a, b, {
    batch,
    m,
    n,
    k,
    transA: orientation === "tn",
    transB: orientation === "nt",
  });
  const act = c.epilogue === "relu" ? (v: number) => Math.max(v, 0) : gelu64;
  const expected = c.epilogue ? product.map((v, i) => act(v + bias[i % n])) : product;
  const what = `${label} ${orientation} ${JSON.stringify(c)}`;
  assertClose(await tc.read(), expected, tolFor(out, k), what);
  [ta, tb, tbias, tc].forEach((t) => t.dispose());
}

/** Runs `fn` with `tiling` forced and split-K aiming at `splitTarget` workgroups (0: never). */
function forced<T>(tiling: MatmulTiling, splitTarget: number, fn: () => Promise<T>): Promise<T> {
  return withTiling(
    tiling,
    () => withSettings(matmulSettings.of(gpu), { splitKWorkgroups: splitTarget }, fn),
  );
}

/** The adapter's subgroup-matrix candidates (those the tuners try on a GPU). */
function candidates(): MatmulTiling[] {
  return subgroupMatrixCandidates(gpu, "f16");
}

Deno.test({
  name: `subgroup-matrix matmul: the adapter has every candidate of its f16→f32 config, which ` +
    `the tuners try as on a GPU (not on this CPU adapter)${CANNOT_RUN}`,
  ...DAWN_TEST,
  async fn() {
    assert.deepEqual(candidates().map(tilingName), subgroupMatrixTilings(config!).map(tilingName));
    assert.ok(candidates().every((t) => t.sm === config!.M && t.sg === config!.subgroupSize));
    const isMatrix = (t: MatmulTiling) => t.variant === "subgroup-matrix";
    assert.equal(gpu.adapterProfile.cpu, !matmulCandidates(gpu, "f16").some(isMatrix));
    const tried = await asGpu(() => Promise.resolve(matmulCandidates(gpu, "f16")));
    assert.deepEqual(tried.filter(isMatrix).map(tilingName), candidates().map(tilingName));
  },
});

/**
 * The shapes that run each path of a candidate's kernel in one orientation,
 * f32 results: interior tiles (vec4 staging and stores) with edge tiles in m
 * and n and a partial last k-tile, batched; odd k (scalar staging on the
 * interior tile) with odd n (scalar stores); single rows, columns and k;
 * split-K over uneven slices, on one tile and on interior tiles; K = 4096 unsplit.
 */
async function checkPaths(tiling: MatmulTiling, orientation: MatmulOrientation) {
  const bm = tiling.tm * tiling.wgy, bn = tiling.tn * tiling.wgx, tk = tiling.tk;
  const name = tilingName(tiling);
  await forced(tiling, 0, async () => {
    await check(
      { batch: 2, m: bm + 4, n: bn + 4, k: 2 * tk + 4, out: "f32" },
      orientation,
      1,
      name,
    );
    await check({ m: 129, n: 385, k: 33, out: "f32" }, orientation, 2, name);
    await check({ batch: 3, m: 1, n: 7, k: 1, out: "f32" }, orientation, 3, name);
    await check({ m: 383, n: 1, k: 7, out: "f32" }, orientation, 4, name);
    await check({ m: 33, n: 7, k: 4096, out: "f32" }, orientation, 5, name);
  });
  await forced(tiling, 256, async () => {
    for (const [m, n, k] of [[33, 7, 4092], [bm, bn, 520]]) {
      assert.ok(gemmSplit(gpu, tiling, { m, n, k }, 1).slices > 1, `${name} splits ${m}x${n}x${k}`);
    }
    // f32 partial sums of the slices, added (and rounded once into f16) by the reduction.
    await check({ m: 33, n: 7, k: 4092, out: "f16" }, orientation, 6, `${name} split`);
    await check({ m: bm, n: bn, k: 520, out: "f32" }, orientation, 7, `${name} split`);
  });
}

// A kernel compiles in 8–25 s of CPU on lavapipe (its cost grows with the matrix products per
// step, emulated there), so the tests compile few: a covering set, not every combination.

Deno.test({
  name: `subgroup-matrix matmul: every candidate, forced, matches f64 at interior, edge, ` +
    `misaligned, degenerate, split-K and K = 4096 shapes (orientations in turn)${CANNOT_RUN}`,
  ...DAWN_TEST,
  async fn() {
    for (const [i, tiling] of candidates().entries()) {
      await checkPaths(tiling, ORIENTATIONS[i % ORIENTATIONS.length]);
    }
  },
});

Deno.test({
  name: `subgroup-matrix matmul: the smallest candidate in every orientation, f16 results, and ` +
    `the bias + ReLU/GELU epilogue (x·Wᵀ + b) match f64${CANNOT_RUN}`,
  ...DAWN_TEST,
  async fn() {
    const tiling = candidates().reduce((a, b) => (a.tm * a.tn <= b.tm * b.tn ? a : b));
    const bm = tiling.tm * tiling.wgy, bn = tiling.tn * tiling.wgx, tk = tiling.tk;
    const name = tilingName(tiling);
    const offset = candidates().indexOf(tiling);
    for (const orientation of ORIENTATIONS.filter((_, o) => o !== offset % ORIENTATIONS.length)) {
      await checkPaths(tiling, orientation);
    }
    await forced(tiling, 0, async () => {
      // f16 results: interior vec4 stores and edge scalars, rounded once from the f32 sums.
      await check({ batch: 2, m: bm + 4, n: bn + 4, k: 2 * tk + 4, out: "f16" }, "nt", 8, name);
      await check({ m: 129, n: 385, k: 33, out: "f16" }, "nt", 9, name);
      // The bias per column group on interior tiles, checked scalars at the edges.
      await check(
        { m: bm + 4, n: bn + 4, k: tk + 4, out: "f16", epilogue: "gelu" },
        "nt",
        10,
        name,
      );
      await check({ m: 7, n: 33, k: 129, out: "f32", epilogue: "relu" }, "nt", 11, name);
    });
  },
});

Deno.test({
  name: `subgroup-matrix matmul: its kernels are named matmul_subgroup_matrix${CANNOT_RUN}`,
  ...DAWN_TEST,
  async fn() {
    const [tiling] = candidates();
    const keys = await forced(
      tiling,
      0,
      () =>
        dispatchedKernelsAsync(() =>
          check({ m: 33, n: 7, k: 33, out: "f32" }, "nn", 10, tilingName(tiling))
        ),
    );
    assert.ok(keys.some((k) => k.startsWith("matmul_subgroup_matrix{")), keys.join(", "));
  },
});

Deno.test({
  name: `subgroup-matrix matmul: every candidate, forced, through the other tilings' edge sweep ` +
    `(one dimension past a tile at a time, all three, m > n and n > m, two batches)${CANNOT_RUN}`,
  ...DAWN_TEST,
  async fn() {
    // The sweep of tests/gpu/kernels/matmul_tilings_test.ts, which never met these tilings (issue 47).
    for (const [i, tiling] of candidates().entries()) {
      await forced(tiling, 0, async () => {
        for (const [n, { dims, guard }] of edgeShapes(tiling).entries()) {
          const label = `${tilingName(tiling)} (${guard})`;
          await check(
            { ...dims, out: "f32" },
            ORIENTATIONS[i % ORIENTATIONS.length],
            40 + n,
            label,
          );
        }
      });
    }
  },
});

requireMatricesOnDawn("subgroup-matrix matmul", config !== undefined);
