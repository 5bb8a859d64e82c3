/**
 * How the subgroup-matrix tilings join the tilings (no kernel runs here, so
 * every adapter runs these): the candidates an adapter profile offers
 * (f16 only, with an f16→f32 config and subgroups), their sizes for the
 * configs lavapipe and NVIDIA list, the WGSL they generate (the extension's
 * `enable`, the config's shapes, col_major loads for transposed operands),
 * the fallback where a forced one cannot take a dtype, the tuners picking
 * them where they measure faster, and `initGpu({ matmulTiling:
 * "subgroup-matrix" })`. tests/gpu/kernels/matmul_subgroup_matrix_test.ts runs them.
 */
import assert from "node:assert/strict";
import {
  type AdapterProfile,
  DTypeError,
  GpuError,
  initGpu,
  matmul,
  type MatmulTiling,
  Tensor,
  tidy,
  tilingName,
  tuneMatmul,
  tuneMatmulShapes,
  ValueError,
} from "../../../gpu/mod.ts";
import { gpuLikeProfile, withAdapterProfile } from "../../helpers/internals.ts";
import { matmulCandidates } from "../../../gpu/kernels/gemm/candidates.ts";
import { DEFAULT_TILING } from "../../../gpu/kernels/gemm/settings.ts";
import { denseProblem, tilingFor } from "../../../gpu/kernels/gemm/matmul_class.ts";
import { type MatmulConfig, matmulKernel } from "../../../gpu/kernels/gemm/matmul.ts";
import { launchMatmulInto } from "../../../gpu/kernels/gemm/matmul.ts";
import { tilingFits, tilingKind } from "../../../gpu/kernels/gemm/tilings.ts";
import { subgroupMatrixTilings } from "../../../gpu/kernels/gemm/gemm_subgroup_matrix.ts";
import { f16MatrixConfig, type SubgroupMatrixConfig } from "../../helpers/internals.ts";
import { forgetMatmulShapes, shapeCacheKey } from "../../../gpu/kernels/gemm/shape_picks.ts";
import { gpu, GPU_TEST, withTiling } from "../../helpers/gpu.ts";
import { defineKernel } from "../../../gpu/mod.ts";
import { secondsPerRun } from "../../helpers/internals.ts";
import { withMemoryStore } from "../../helpers/tuning.ts";
import { withLazyTuning } from "../../helpers/lazy_tuning.ts";

const f16 = { componentType: "f16", resultComponentType: "f32" } as const;
/** What NVIDIA's Vulkan driver is expected to list (with subgroups of 32), and lavapipe's. */
const NVIDIA: SubgroupMatrixConfig = { ...f16, M: 16, N: 16, K: 16, subgroupSize: 32 };
const NVIDIA_NARROW: SubgroupMatrixConfig = { ...NVIDIA, N: 8 };
const LAVAPIPE: SubgroupMatrixConfig = { ...f16, M: 8, N: 8, K: 8, subgroupSize: 8 };
const F16_RESULT: SubgroupMatrixConfig = { ...NVIDIA, resultComponentType: "f16" };
const I8: SubgroupMatrixConfig = { ...NVIDIA, componentType: "i8", resultComponentType: "i32" };

/** A GPU-like profile with `configs` and subgroups (H100 limits, capped at this device's). */
function profileWith(
  configs: SubgroupMatrixConfig[],
  more: Partial<AdapterProfile> = {},
): AdapterProfile {
  return { ...gpuLikeProfile(gpu), subgroups: true, subgroupMatrixConfigs: configs, ...more };
}

const isMatrix = (t: MatmulTiling) => t.variant === "subgroup-matrix";

Deno.test({
  name: "subgroup-matrix tilings: offered first on GPUs, for f16 only, where the profile has " +
    "an f16→f32 config (the largest) and subgroups",
  ...GPU_TEST,
  async fn() {
    const offered = (profile: AdapterProfile, dtype: "f32" | "f16" | "bf16" = "f16") =>
      withAdapterProfile(gpu, profile, () => Promise.resolve(matmulCandidates(gpu, dtype)));
    const all = await offered(profileWith([I8, F16_RESULT, NVIDIA_NARROW, NVIDIA]));
    const matrices = all.filter(isMatrix);
    assert.deepEqual(all.slice(0, matrices.length), matrices, "first");
    assert.ok(matrices.length > 0 && matrices.every((t) => t.sn === 16 && t.sg === 32));
    for (const dtype of ["f32", "bf16"] as const) {
      assert.ok(!(await offered(profileWith([NVIDIA]), dtype)).some(isMatrix), dtype);
    }
    for (
      const profile of [
        profileWith([]),
        profileWith([F16_RESULT, I8]),
        profileWith([NVIDIA], { subgroups: false }),
      ]
    ) {
      assert.ok(!(await offered(profile)).some(isMatrix), JSON.stringify(profile));
    }
    // CPU adapters with the feature (lavapipe through Dawn) keep their CPU tilings.
    const cpu = await offered(profileWith([LAVAPIPE], { cpu: true }));
    assert.ok(!cpu.some(isMatrix) && cpu.some((t) => t.variant === "register"));
    // Workgroup memory filters them as any tiling.
    const small = await offered(
      profileWith([NVIDIA], {
        limits: { ...gpuLikeProfile(gpu).limits, maxComputeWorkgroupStorageSize: 16384 },
      }),
    );
    assert.deepEqual(
      small.filter(isMatrix).map(tilingName),
      subgroupMatrixTilings(NVIDIA).filter((t) => tilingKind(t).workgroupBytes(t, "f16") <= 16384)
        .map(tilingName),
    );
  },
});

Deno.test("subgroup-matrix tilings: lavapipe's and NVIDIA's configs give valid, distinct candidates whose workgroups are whole subgroups and fit 48 KiB", () => {
  const limits = { maxComputeInvocationsPerWorkgroup: 1024, maxComputeWorkgroupStorageSize: 49152 };
  for (const config of [LAVAPIPE, NVIDIA, NVIDIA_NARROW]) {
    const tilings = subgroupMatrixTilings(config);
    const names = tilings.map(tilingName);
    assert.equal(new Set(names).size, names.length, names.join(", "));
    for (const t of tilings) {
      const kind = tilingKind(t);
      assert.equal(kind.shapeProblem(t), null, tilingName(t));
      assert.ok(tilingFits(t, "f16", limits), tilingName(t));
      assert.ok(!tilingFits(t, "f32", limits) && !tilingFits(t, "bf16", limits), "f16 only");
      assert.equal(kind.threads!(t) % config.subgroupSize, 0);
      assert.ok(t.tm % config.M === 0 && t.tn % config.N === 0 && t.tk % config.K === 0);
    }
  }
  // NVIDIA: the SIMT probe's 128×128 and 128×256 tiles with a k-step of 32, and 64×64.
  assert.deepEqual(subgroupMatrixTilings(NVIDIA).map(tilingName), [
    "subgroup-matrix 128x128x32 s64x64 m16x16x16",
    "subgroup-matrix 128x128x32 s64x32 m16x16x16",
    "subgroup-matrix 128x256x32 s64x64 m16x16x16",
    "subgroup-matrix 64x64x32 s32x32 m16x16x16",
  ]);
  const bad = { ...subgroupMatrixTilings(NVIDIA)[0], tm: 24 };
  assert.match(tilingKind(bad).shapeProblem(bad)!, /multiples of the config's 16/);
});

/** The WGSL of the first NVIDIA candidate in `orientation` (f16 operands, f32 result). */
function nvidiaWgsl(aAlong: "k" | "row", bAlong: "k" | "col"): string {
  const config: MatmulConfig = {
    ...subgroupMatrixTilings(NVIDIA)[0],
    aAlong,
    bAlong,
    f16Chunk: 0,
    dtype: "f16",
    out: "f32",
    bias: "none",
    activation: "none",
  };
  return matmulKernel.wgsl(config);
}

Deno.test("subgroup-matrix tilings: the WGSL enables the extension, uses the config's shapes and subgroups, and reads transposed operands column-major", () => {
  const nn = nvidiaWgsl("k", "col");
  assert.match(
    nn,
    /^(enable subgroups;\n)?enable chromium_experimental_subgroup_matrix;\nenable f16;/,
  );
  assert.ok(nn.includes("@workgroup_size(128)"), "4 subgroups of 32");
  assert.ok(nn.includes("subgroup_matrix_result<f32, 16, 16>"));
  assert.ok(nn.includes("subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>"));
  assert.ok(nn.includes("subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, row_major>"));
  const nt = nvidiaWgsl("k", "k"), tn = nvidiaWgsl("row", "col");
  assert.ok(nt.includes("subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, col_major>"));
  assert.ok(tn.includes("subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, col_major>"));
  // Other kernels get no directive.
  const vec4 = matmulKernel.wgsl({
    ...DEFAULT_TILING,
    variant: "vec4",
    tm: 4,
    tn: 4,
    wgx: 16,
    wgy: 16,
    tk: 16,
    aAlong: "k",
    bAlong: "col",
    f16Chunk: 0,
    dtype: "f16",
    out: "f32",
    bias: "none",
    activation: "none",
  });
  assert.ok(!vec4.includes("subgroup_matrix"));
});

Deno.test({
  name: "subgroup-matrix tilings: forced for every class, f32 and bf16 products keep the default " +
    "tiling; forced on one f32 product, a DTypeError",
  ...GPU_TEST,
  async fn() {
    const tiling = subgroupMatrixTilings(LAVAPIPE)[0];
    const problem = denseProblem({ batch: 1, m: 8, n: 8, k: 8 }, "nn");
    await withTiling(tiling, () => {
      assert.equal(tilingFor(gpu, problem, "f16"), tiling);
      assert.equal(tilingFor(gpu, problem, "f32"), DEFAULT_TILING);
      assert.equal(tilingFor(gpu, problem, "bf16"), DEFAULT_TILING);
      return Promise.resolve();
    });
    const a = Tensor.zeros([64]), c = Tensor.empty([64], "f32", gpu);
    assert.throws(
      () => launchMatmulInto(problem, a, a, c, {}, tiling),
      (e) => e instanceof DTypeError && /takes f16 operands, not f32/.test(e.message),
    );
    [a, c].forEach((t) => t.dispose());
  },
});

/** A timer that calls subgroup-matrix candidates faster than any other (no kernel runs). */
const favouringMatrices = (tiling: MatmulTiling) => Promise.resolve(isMatrix(tiling) ? 1e-4 : 1e-3);

Deno.test({
  name: "subgroup-matrix tilings: the class and per-shape tuners pick one where it measures " +
    "fastest, trying every one within the per-shape budget",
  ...GPU_TEST,
  async fn() {
    // An empty store in memory: nothing cached is reused, and no pick reaches the user's cache.
    await withMemoryStore(() =>
      withAdapterProfile(gpu, profileWith([NVIDIA]), async () => {
        const classes = [
          { dtype: "f16", orientation: "nt", size: "large" },
          { dtype: "f32", orientation: "nt", size: "large" },
        ] as const;
        const [f16, f32] = await tuneMatmul(gpu, { classes, timer: favouringMatrices });
        assert.ok(isMatrix(f16.best) && !isMatrix(f32.best));
        const tried: MatmulTiling[] = [];
        forgetMatmulShapes(gpu);
        try {
          const [pick] = await tuneMatmulShapes(gpu, {
            shapes: [{
              m: 4096,
              n: 4096,
              k: 4096,
              batch: 1,
              orientation: "tn",
              dtype: "f16",
              out: "f16",
              bias: "none",
              activation: "none",
            }],
            timer: (p) => {
              tried.push(p.tiling);
              return favouringMatrices(p.tiling);
            },
          });
          assert.ok(isMatrix(pick.pick.tiling), tilingName(pick.pick.tiling));
          // Those that fit this device's workgroup memory (the profile's limits are capped at it).
          const offered = matmulCandidates(gpu, "f16").filter(isMatrix);
          assert.ok(offered.length >= 3);
          const names = new Set(tried.map(tilingName));
          for (const t of offered) assert.ok(names.has(tilingName(t)), tilingName(t));
        } finally {
          forgetMatmulShapes(gpu);
        }
      })
    );
  },
});

Deno.test({
  name:
    "subgroup-matrix tilings: a candidate whose kernel fails on the adapter times as Infinity " +
    "(never picked) and the device stays usable",
  ...GPU_TEST,
  async fn() {
    // A kernel no WGSL front end accepts, as a driver may reject a subgroup-matrix shape.
    const broken = defineKernel({
      name: "broken_candidate",
      bindings: () => [{ name: "x", type: "f32", write: true }],
      uniforms: {},
      source: () => "@compute @workgroup_size(1)\nfn main() { x[0] = no_such_value; }",
    });
    const x = Tensor.zeros([4]), square = Tensor.zeros([2, 2]);
    const seconds = await secondsPerRun(
      gpu,
      () => gpu.dispatch(gpu.kernel(broken, {}), { x }, {}, [1]),
    );
    assert.equal(seconds, Infinity);
    const working = await secondsPerRun(
      gpu,
      () => tidy(() => void matmul(square, square)),
    );
    assert.ok(Number.isFinite(working) && working > 0);
    [x, square].forEach((t) => t.dispose());
  },
});

Deno.test({
  name: "subgroup-matrix tilings: tuned winners are cached apart where the device has subgroup " +
    "matrices (one adapter through Dawn has candidates it lacks through Deno's WebGPU)",
  ...GPU_TEST,
  async fn() {
    const keyWith = (configs: SubgroupMatrixConfig[]) =>
      withAdapterProfile(
        gpu,
        profileWith(configs),
        () => Promise.resolve(shapeCacheKey(gpu)),
      );
    const [none, nvidia] = [await keyWith([]), await keyWith([NVIDIA])];
    assert.notEqual(none, nvidia);
    assert.match(nvidia, /subgroup-matrix 16x16x16/);
    assert.equal(await keyWith([I8]), none, "only an f16→f32 config counts");
  },
});

const matrixConfig = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);

Deno.test({
  name: "subgroup-matrix tilings: initGpu({ matmulTiling: 'subgroup-matrix' }) without subgroup " +
    "matrices is a GpuError naming what to use" +
    (matrixConfig ? " (IGNORED: this adapter has them; the next test covers it)" : ""),
  ignore: matrixConfig !== undefined,
  ...GPU_TEST,
  async fn() {
    await assert.rejects(
      initGpu({ matmulTiling: "subgroup-matrix", setDefault: false }),
      (e) => e instanceof GpuError && /Dawn backend.*docs\/tensor_cores\.md/.test(e.message),
    );
  },
});

Deno.test({
  name: "subgroup-matrix tilings: initGpu({ matmulTiling: 'subgroup-matrix' }) forces one for " +
    "every f16 class and nothing else" +
    (matrixConfig ? "" : " (IGNORED: this adapter has no f16→f32 subgroup-matrix config)"),
  ignore: matrixConfig === undefined,
  ...GPU_TEST,
  async fn() {
    const forced = await initGpu({ matmulTiling: "subgroup-matrix", setDefault: false });
    try {
      for (const orientation of ["nn", "nt", "tn"] as const) {
        const problem = denseProblem({ batch: 1, m: 4096, n: 64, k: 7 }, orientation);
        assert.ok(isMatrix(tilingFor(forced, problem, "f16")), orientation);
        assert.equal(tilingFor(forced, problem, "f32"), DEFAULT_TILING);
      }
    } finally {
      forced.destroy();
    }
  },
});

Deno.test("subgroup-matrix tilings: initGpu lists 'subgroup-matrix' among the matmulTiling names", async () => {
  await assert.rejects(
    // @ts-expect-error: not a valid name
    initGpu({ matmulTiling: "subgroup_matrix" }),
    (e) => e instanceof ValueError && /"subgroup-matrix"/.test(e.message),
  );
});

Deno.test({
  name: "subgroup-matrix tilings: lazy tuning times them for an f16 class on a GPU that has " +
    "them, never on a CPU adapter that has them too (lavapipe through Dawn)",
  ...GPU_TEST,
  async fn() {
    const timedOn = async (profile: AdapterProfile) => {
      let timings: string[] = [];
      await withLazyTuning({}, async (lazy) => {
        const [m, k, n] = [96, 128, 80]; // 983040 multiply-adds: worth tuning
        const a = Tensor.full([m, k], 0.25, { dtype: "f16" }),
          b = Tensor.full([k, n], 0.5, { dtype: "f16" });
        const c = matmul(a, b);
        const read = await c.read(); // the wait
        assert.ok(read.every((v) => v === 16), "0.25 · 0.5 summed 128 times, run untuned");
        [a, b, c].forEach((t) => t.dispose());
        timings = lazy.timings;
      }, (run) => withAdapterProfile(gpu, profile, run));
      // The class tuner times tilings, the per-shape one (GPUs) {tiling, slices} picks.
      return timings.map((text) => {
        const timed = JSON.parse(text);
        return (typeof timed.variant === "string" ? timed : timed.tiling) as MatmulTiling;
      });
    };
    const cpu = await timedOn(profileWith([LAVAPIPE], { cpu: true }));
    assert.ok(cpu.length > 0, "the class was tuned");
    assert.deepEqual(cpu.filter(isMatrix), [], "none timed on a CPU adapter");
    const onGpu = await timedOn(profileWith([NVIDIA]));
    const offered = await withAdapterProfile(
      gpu,
      profileWith([NVIDIA]),
      () => Promise.resolve(matmulCandidates(gpu, "f16").filter(isMatrix)),
    );
    const timedNames = new Set(onGpu.filter(isMatrix).map(tilingName));
    assert.deepEqual([...timedNames].sort(), offered.map(tilingName).sort(), "each one on a GPU");
  },
});
