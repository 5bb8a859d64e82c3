/**
 * How the subgroup-matrix (tensor-core) attention forward joins the fused
 * attention's plans, on every backend (no kernel of it is checked here; one
 * must fail to compile, and on Dawn the forced device runs one): the
 * candidates an adapter profile offers (f16 only, GPUs with an f16→f32
 * config and subgroups, head sizes and workgroup memory it fits), the tuner
 * picking it where it measures fastest, a failed compile timing as
 * Infinity, and `initGpu({ attentionPlan: "subgroup-matrix" })`, also beside
 * lazy tuning. tests/gpu/kernels/attention_subgroup_matrix_test.ts runs it against f64
 * on Dawn.
 */
import assert from "node:assert/strict";
import {
  type AdapterProfile,
  type AttentionPlan,
  type FloatDType,
  fusedCausalAttention,
  GpuError,
  initGpu,
  matmul,
  pendingTuning,
  Tensor,
  tidy,
  tuneAttention,
  tuneAttentionShapes,
  ValueError,
} from "../../../gpu/mod.ts";
import {
  attentionPlanCandidates,
  DEFAULT_ATTENTION_PLAN,
  TILED_ATTENTION_PLANS,
  tileFits,
} from "../../../gpu/kernels/attention/plans.ts";
import {
  attentionMatrixFor,
  matrixAttentionBytes,
} from "../../../gpu/kernels/attention/flash_attention_subgroup_matrix.ts";
import { attentionSettings } from "../../../gpu/kernels/attention/settings.ts";
import { matrixBackwardsFor } from "../../../gpu/kernels/attention/flash_attention_subgroup_matrix_backward.ts";
import { gpuLikeProfile, withAdapterProfile } from "../../helpers/internals.ts";
import { secondsPerRun } from "../../helpers/internals.ts";
import { f16MatrixConfig, type SubgroupMatrixConfig } from "../../helpers/internals.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { withMemoryStore } from "../../helpers/tuning.ts";
import { requireMatricesOnDawn } from "../../helpers/dawn_pass.ts";

const config = f16MatrixConfig(gpu.adapterProfile.subgroupMatrixConfigs);

const f16 = { componentType: "f16", resultComponentType: "f32" } as const;
/** What NVIDIA's Vulkan driver is expected to list (with subgroups of 32), and lavapipe's. */
const NVIDIA: SubgroupMatrixConfig = { ...f16, M: 16, N: 16, K: 16, subgroupSize: 32 };
const LAVAPIPE: SubgroupMatrixConfig = { ...f16, M: 8, N: 8, K: 8, subgroupSize: 8 };

/** A GPU-like profile with `configs`, subgroups and an H100's 48 KiB of workgroup memory. */
function profileWith(
  configs: SubgroupMatrixConfig[],
  more: Partial<AdapterProfile> = {},
  workgroupBytes = 49152,
): AdapterProfile {
  const base = gpuLikeProfile(gpu);
  return {
    ...base,
    subgroups: true,
    subgroupMatrixConfigs: configs,
    limits: { ...base.limits, maxComputeWorkgroupStorageSize: workgroupBytes },
    ...more,
  };
}

const asProfile = <T>(profile: AdapterProfile, fn: () => T) =>
  withAdapterProfile(gpu, profile, () => Promise.resolve(fn()));

Deno.test({
  name: "subgroup-matrix attention: offered on GPUs with an f16→f32 config, for f16 only, " +
    "paired with the default row plan's and each fitting tiled plan's backward",
  ...GPU_TEST,
  async fn() {
    const matrices = (profile: AdapterProfile, d = 64, dtype: FloatDType = "f16") =>
      asProfile(profile, () => attentionPlanCandidates(gpu, d, dtype).filter((p) => p.matrix));
    await asProfile(profileWith([NVIDIA]), () => {
      const all = attentionPlanCandidates(gpu, 64, "f16");
      const paired = all.filter((p) => p.matrix);
      const matrix = { sm: 16, sn: 16, sk: 16, sg: 32, pin: false, subgroups: 4, bc: 64 };
      const backwards = [DEFAULT_ATTENTION_PLAN, ...TILED_ATTENTION_PLANS]
        .filter((p) => !p.tile || tileFits(gpu, p, 64));
      // And the whole attention on subgroup matrices, in the (at most two) largest backward shapes.
      const matrixBackwards = matrixBackwardsFor(gpu, 64, "f16");
      assert.ok(matrixBackwards.length > 0);
      assert.deepEqual(paired, [
        ...backwards.map((p) => ({ ...p, matrix })),
        ...matrixBackwards.slice(0, 2).map((matrixBackward) => ({
          ...DEFAULT_ATTENTION_PLAN,
          matrix,
          matrixBackward,
        })),
      ]);
      // Every SIMT plan stays a candidate of its own.
      assert.deepEqual(all.filter((p) => !p.matrix), attentionPlanCandidates(gpu, 64, "f32"));
    });
    // D = 128: 64 query rows' tiles pass 48 KiB; 2 subgroups of 16 rows and 32 keys fit.
    const wide = await matrices(profileWith([NVIDIA]), 128);
    assert.ok(wide.length > 0 && wide.every((p) => p.matrix!.subgroups === 2));
    assert.ok(matrixAttentionBytes(wide[0].matrix!, 128) <= 49152);
    // lavapipe's 8×8×8 within its 32 KiB: 4 subgroups of 8 rows, 32 keys per step.
    const small = await matrices(profileWith([LAVAPIPE], {}, 32768));
    assert.deepEqual(small[0].matrix, {
      sm: 8,
      sn: 8,
      sk: 8,
      sg: 8,
      pin: false,
      subgroups: 4,
      bc: 32,
    });
    const none: [string, Promise<AttentionPlan[]>][] = [
      ["f32", matrices(profileWith([NVIDIA]), 64, "f32")],
      ["bf16", matrices(profileWith([NVIDIA]), 64, "bf16")],
      ["D = 24, not a multiple of 16", matrices(profileWith([NVIDIA]), 24)],
      ["a CPU adapter (lavapipe through Dawn)", matrices(profileWith([LAVAPIPE], { cpu: true }))],
      ["no subgroups", matrices(profileWith([NVIDIA], { subgroups: false }))],
      ["no f16→f32 config", matrices(profileWith([{ ...NVIDIA, resultComponentType: "f16" }]))],
      ["no config", matrices(profileWith([]))],
      ["16 KiB of workgroup memory", matrices(profileWith([NVIDIA], {}, 16384))],
    ];
    for (const [why, offered] of none) assert.deepEqual(await offered, [], why);
  },
});

Deno.test({
  name: "subgroup-matrix attention: tuneAttention picks it for f16 where it measures fastest " +
    "(injected timer), never for f32 or bf16",
  ...GPU_TEST,
  fn: () =>
    asProfile(profileWith([NVIDIA]), async () => {
      const fastest = (p: AttentionPlan) => p.matrix !== undefined && p.tile === undefined;
      const tuned = await tuneAttention(gpu, {
        timer: (plan) => Promise.resolve(fastest(plan) ? 1e-3 : 2e-3),
        onProgress: () => {},
      });
      try {
        for (const t of tuned) {
          assert.equal(fastest(t.best), t.dtype === "f16", t.dtype);
          assert.equal(t.measurements.some((m) => m.plan.matrix), t.dtype === "f16", t.dtype);
          assert.equal(attentionSettings.of(gpu).plans.get(t.dtype), t.best);
        }
      } finally {
        attentionSettings.of(gpu).plans.clear();
      }
    }),
});

Deno.test({
  name: "subgroup-matrix attention: a candidate whose forward fails to compile on the adapter " +
    "times as Infinity, is never picked, and the device stays usable",
  ...GPU_TEST,
  fn: () =>
    // A 16×16×16 config this adapter does not list (lavapipe lists 8×8×8; Deno's WebGPU none):
    // pipeline creation fails, as a driver may reject a shape designed without a GPU at hand.
    asProfile(profileWith([NVIDIA], {}, 32768), async () => {
      const times: { plan: AttentionPlan; seconds: number }[] = [];
      const shape = { heads: 2, t: 16, headSize: 16, dtype: "f16" as const };
      const [tuning] = await tuneAttentionShapes(gpu, {
        shapes: [shape],
        async timer(plan, run) {
          // Only the subgroup-matrix pairings run (the others would compile every SIMT plan).
          const seconds = plan.matrix && !plan.tile ? await secondsPerRun(gpu, run) : 2e-3;
          times.push({ plan, seconds });
          return seconds;
        },
      });
      const timed = times.filter((t) => t.plan.matrix && !t.plan.tile);
      assert.ok(timed.length > 0 && timed.every((t) => t.seconds === Infinity), "Infinity");
      assert.ok(!tuning.plan.matrix, "never picked");
      const square = tidy(() => matmul(Tensor.full([4, 4], 1), Tensor.full([4, 4], 1)));
      assert.deepEqual([...await square.read()], Array(16).fill(4));
      square.dispose();
    }),
});

const F16_CONFIG = gpu.f16 && config !== undefined;

Deno.test({
  name: "subgroup-matrix attention: initGpu({ attentionPlan: 'subgroup-matrix' }) without " +
    "subgroup matrices is a GpuError naming what to use" +
    (F16_CONFIG ? " (IGNORED: this adapter has them; the next test covers it)" : ""),
  ignore: F16_CONFIG,
  ...GPU_TEST,
  async fn() {
    await assert.rejects(
      initGpu({
        backend: gpu.backend,
        matmulTiling: "default",
        attentionPlan: "subgroup-matrix",
        setDefault: false,
      }),
      (e) => e instanceof GpuError && /Dawn backend.*docs\/tensor_cores\.md/.test(e.message),
    );
  },
});

Deno.test({
  name: "subgroup-matrix attention: initGpu({ attentionPlan: 'subgroup-matrix' }) puts it in " +
    "the f16 plan only" +
    (F16_CONFIG ? "" : " (IGNORED: this adapter has no f16→f32 subgroup-matrix config)"),
  ignore: !F16_CONFIG,
  ...GPU_TEST,
  async fn() {
    const forced = await initGpu({
      backend: gpu.backend, // the shared device's (Dawn where it has the config)
      matmulTiling: "default",
      attentionPlan: "subgroup-matrix",
      setDefault: false,
    });
    try {
      const { plans } = attentionSettings.of(forced);
      // The forward and the backward on subgroup matrices (the largest backward that fits).
      assert.deepEqual(plans.get("f16"), {
        ...DEFAULT_ATTENTION_PLAN,
        matrix: attentionMatrixFor(forced, 64, "f16"),
        matrixBackward: matrixBackwardsFor(forced, 64, "f16")[0],
      });
      assert.ok(!plans.get("f32")?.matrix && !plans.get("bf16")?.matrix);
    } finally {
      forced.destroy();
    }
  },
});

Deno.test({
  name: "subgroup-matrix attention: with lazy tuning the forced f16 plan stays: f16 attention " +
    "is not noted for tuning (f32 attention is) and the plan is unchanged after it ran" +
    (F16_CONFIG ? "" : " (IGNORED: this adapter has no f16→f32 subgroup-matrix config)"),
  ignore: !F16_CONFIG,
  ...GPU_TEST,
  fn: () =>
    withMemoryStore(async () => {
      const forced = await initGpu({
        backend: gpu.backend,
        tuning: "lazy",
        attentionPlan: "subgroup-matrix",
        setDefault: false,
        onProgress: () => {},
      });
      try {
        const plan = attentionSettings.of(forced).plans.get("f16");
        assert.ok(plan?.matrix, "forced");
        const attend = (dtype: FloatDType) => {
          const q = Tensor.full([1, 64, 128], 0.1, { dtype, gpu: forced });
          fusedCausalAttention(q, q, q, { heads: 2 }).dispose();
          q.dispose();
        };
        attend("f16");
        const noted = () => pendingTuning(forced).map((p) => `${p.task} ${p.key}`);
        assert.ok(!noted().some((k) => k.startsWith("attention")), noted().join(", "));
        attend("f32"); // an unforced dtype is still tuned lazily
        assert.ok(noted().includes("attention plans f32"), noted().join(", "));
        assert.equal(attentionSettings.of(forced).plans.get("f16"), plan, "still forced");
      } finally {
        forced.destroy();
      }
    }),
});

Deno.test("subgroup-matrix attention: initGpu checks the attentionPlan names", async () => {
  await assert.rejects(
    // @ts-expect-error: not a valid name
    initGpu({ attentionPlan: "subgroup_matrix" }),
    (e) => e instanceof ValueError && /"auto" or "subgroup-matrix"/.test(e.message),
  );
});

requireMatricesOnDawn("subgroup-matrix attention plans", F16_CONFIG);
