/**
 * The GPU path on a CPU adapter: with the device run as a GPU
 * (`withAdapterProfile(gpu, gpuLikeProfile(gpu), ...)`, see
 * gpu/device/adapter_profile.ts) the library takes every branch a user's GPU takes —
 * blocked tilings, their workgroup-memory filter, the size classes, split-K
 * at a GPU's target — while lavapipe executes the kernels, checked here
 * against f64.
 */
import assert from "node:assert/strict";
import {
  matmul,
  MATMUL_CANDIDATES,
  type MatmulTiling,
  Tensor,
  tuneMatmul,
} from "../../../gpu/mod.ts";
import { defaultTuningClasses, matmulCandidates } from "../../../gpu/mod.ts";
import { subgroupMatrixCandidates } from "../../helpers/internals.ts";
import { classOf, matmulClassKey, tilingFor, tilingName } from "../../../gpu/mod.ts";
import { gemmSlices, gemmSplit, sliceLength } from "../../helpers/internals.ts";
import { tilingFits, tilingKind } from "../../helpers/internals.ts";
import { attentionPlanCandidates, launchFlashAttention } from "../../helpers/internals.ts";
import { asGpu, dispatchedKernels, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { matmul64, quantize, uniform } from "../../helpers/reference.ts";
import { assertClose, tolFor } from "../../helpers/assert.ts";
import { matmulSettings } from "../../../gpu/mod.ts";
import { rowSettings } from "../../../gpu/mod.ts";
import { multiTensorSettings } from "../../../gpu/mod.ts";
import { attentionSettings } from "../../../gpu/mod.ts";

const BLOCKED = MATMUL_CANDIDATES.filter((t) => t.variant === "blocked");
const BLOCKED_128 = BLOCKED[0];

Deno.test({
  name: "adapter profile: the device's own, and the GPU-like one steering every adapter choice",
  ...GPU_TEST,
  async fn() {
    const own = gpu.adapterProfile;
    assert.equal(own.name, "adapter");
    assert.equal(own.cpu, gpu.adapterInfo.isFallbackAdapter);
    for (const [name, value] of Object.entries(own.limits)) {
      assert.equal(value, gpu.device.limits[name as keyof typeof own.limits], name);
    }
    const before = {
      slots: multiTensorSettings.of(gpu).slots,
      split: matmulSettings.of(gpu).splitKWorkgroups,
    };
    await asGpu(() => {
      const p = gpu.adapterProfile;
      assert.deepEqual([p.cpu, p.subgroupSize], [false, 32]);
      // A GPU's limits, never past what this device can run.
      assert.ok(p.limits.maxComputeWorkgroupStorageSize <= 49152);
      for (const [name, value] of Object.entries(p.limits)) {
        assert.ok(value <= gpu.device.limits[name as keyof typeof p.limits], name);
      }
      assert.deepEqual(
        [
          rowSettings.of(gpu).threadRowMax,
          multiTensorSettings.of(gpu).slots,
          matmulSettings.of(gpu).splitKWorkgroups,
        ],
        [64, 16, 256],
      );
      // Every candidate that fits, GPU ones included, after the subgroup-matrix ones where the
      // device has them (through Dawn: tests/gpu/kernels/subgroup_matrix_tilings_test.ts tests those); every
      // class size; staged attention plans.
      for (const dtype of ["f32", "f16"] as const) {
        const candidates = matmulCandidates(gpu, dtype);
        const fit = MATMUL_CANDIDATES.filter((t) => tilingFits(t, dtype, p.limits));
        assert.deepEqual(candidates, [...subgroupMatrixCandidates(gpu, dtype), ...fit], dtype);
        assert.ok(BLOCKED.every((t) => candidates.includes(t)), `${dtype}: blocked tilings run`);
        assert.ok(
          candidates.filter((t) => t.variant === "vec4").length >= 4,
          `${dtype}: vec4 tilings run`,
        );
      }
      const sizes = new Set(defaultTuningClasses(gpu).map((c) => c.size));
      assert.deepEqual([...sizes], ["small", "medium", "large"]);
      assert.ok(attentionPlanCandidates(gpu).some((plan) => plan.stage > 0), "staged plans");
      // Split-K at a GPU's target: the GPT's fc1 weight gradient (36 tiles, K = 16384) in 8 slices.
      const fc1 = sliceLength(16384, gemmSlices(gpu, BLOCKED_128, 36, 16384), BLOCKED_128);
      assert.deepEqual(fc1, { length: 2048, slices: 8 });
      return Promise.resolve();
    });
    // Restored: the adapter's own profile and choices.
    assert.equal(gpu.adapterProfile, own);
    assert.deepEqual({
      slots: multiTensorSettings.of(gpu).slots,
      split: matmulSettings.of(gpu).splitKWorkgroups,
    }, before);
    if (own.cpu) assert.ok(matmulCandidates(gpu, "f32").every((t) => !tilingKind(t).forGpus));
  },
});

Deno.test({
  name: "adapter profile: on a device with 16 KiB of workgroup memory the tuner drops " +
    "the tilings whose tiles pass it (f16 halves the blocked tiles) and never times them",
  ...GPU_TEST,
  async fn() {
    const bytes = (t: MatmulTiling, dtype: "f32" | "f16") => tilingKind(t).workgroupBytes(t, dtype);
    const vec4 = MATMUL_CANDIDATES.filter((t) => t.variant === "vec4");
    // k-rows of BM/4 + 1 and BN/4 + 1 vec4s (the padding of a transposed store), f32 tiles.
    assert.deepEqual(vec4.map((t) => bytes(t, "f32")), [33792, 25088, 12544, 20992, 16896, 8704]);
    assert.deepEqual(vec4.map((t) => bytes(t, "f16")), [33792, 25088, 12544, 20992, 16896, 8704]);
    const tooLarge = BLOCKED.find((t) => t.tm === 8 && t.tn === 8 && t.wgy === 16 && t.tk === 16)!;
    assert.equal(bytes(tooLarge, "f32"), 16896);
    assert.equal(bytes(tooLarge, "f16"), 8448);
    await asGpu(async () => {
      // The SIMT GPU tilings (the subgroup-matrix ones a Dawn device adds are another family's).
      const names = (dtype: "f32" | "f16") =>
        matmulCandidates(gpu, dtype)
          .filter((t) => tilingKind(t).forGpus && t.variant !== "subgroup-matrix").map(tilingName);
      assert.deepEqual(names("f32"), ["vec4 128x256x8 t8x16", "vec4 64x64x16 t4x4"]);
      assert.deepEqual(names("f16"), [
        "vec4 128x256x8 t8x16",
        "vec4 64x64x16 t4x4",
        "blocked 128x128x16 t8x8",
      ]);
      // The tuner times only what fits, even when the dropped tiling would look fastest.
      const timed: MatmulTiling[] = [];
      const [result] = await tuneMatmul(gpu, {
        classes: [{ dtype: "f32", orientation: "nn", size: "small" }],
        timer: (tiling) => {
          timed.push(tiling);
          return Promise.resolve(tiling === tooLarge ? 1e-6 : 1e-3 * (1 + timed.length));
        },
      });
      assert.ok(!timed.includes(tooLarge), "the dropped tiling was timed");
      assert.notEqual(result.best, tooLarge);
    }, { maxComputeWorkgroupStorageSize: 16384 });
    // And by threads: a device of 128 threads per workgroup keeps only workgroups that small.
    await asGpu(() => {
      const small = matmulCandidates(gpu, "f32");
      assert.ok(small.length > 0 && small.every((t) => t.wgx * t.wgy <= 128));
      assert.equal(small.length, MATMUL_CANDIDATES.filter((t) => t.wgx * t.wgy <= 128).length);
      return Promise.resolve();
    }, { maxComputeInvocationsPerWorkgroup: 128 });
  },
});

Deno.test({
  name: "adapter profile: the GPU's size classes are tuned and dispatch picks each class's winner",
  ...GPU_TEST,
  async fn() {
    await asGpu(async () => {
      // A timer that favours a different candidate per class: the k-th class's winner is candidate k mod n.
      const classes = defaultTuningClasses(gpu).filter((c) => c.dtype === "f32");
      const winners = new Map<string, MatmulTiling>();
      for (const [i, c] of classes.entries()) {
        const candidates = matmulCandidates(gpu, c.dtype);
        const winner = candidates[i % candidates.length];
        winners.set(matmulClassKey(c), winner);
        await tuneMatmul(gpu, {
          classes: [c],
          timer: (tiling) => Promise.resolve(tiling === winner ? 1e-4 : 1e-3),
        });
      }
      const problem = (m: number, n: number, k: number) => ({
        batch: 1,
        m,
        n,
        k,
        a: { batch: 0, row: k, col: 1 },
        b: { batch: 0, row: n, col: 1 },
      });
      for (
        const [[m, n, k], size] of [[[64, 64, 64], "small"], [[256, 256, 256], "medium"], [
          [1024, 1024, 1024],
          "large",
        ]] as const
      ) {
        const p = problem(m, n, k);
        assert.equal(classOf(p, "f32").size, size);
        const expected = winners.get(matmulClassKey({ dtype: "f32", orientation: "nn", size }))!;
        assert.equal(tilingFor(gpu, p, "f32"), expected, `${size}: ${tilingName(expected)}`);
      }
    });
    assert.equal(
      matmulSettings.of(gpu).classTilings.size,
      0,
      "the test profile's winners are dropped after it",
    );
  },
});

// Uneven last slices (K not a multiple of a slice, nor of a tile's K step), each in another
// orientation and batch count, with results smaller than one workgroup tile.
const SWEEP = [
  { batch: 2, m: 5, n: 9, k: 1031, transA: false, transB: false },
  { batch: 1, m: 33, n: 17, k: 1500, transA: true, transB: false },
  { batch: 3, m: 7, n: 20, k: 2500, transA: false, transB: true },
];

Deno.test({
  name: "adapter profile: every GPU tiling, split and unsplit, with uneven last slices, " +
    "f32 and f16, batched, matches f64",
  ...GPU_TEST,
  async fn() {
    await asGpu(async () => {
      const chosen = matmulSettings.of(gpu).tiling;
      try {
        for (const dtype of gpu.f16 ? ["f32", "f16"] as const : ["f32"] as const) {
          const tilings = matmulCandidates(gpu, dtype).filter((t) => t.variant === "blocked");
          assert.equal(tilings.length, BLOCKED.length);
          for (const [s, dims] of SWEEP.entries()) {
            const { batch, m, n, k, transA, transB } = dims;
            const a = quantize(uniform(batch * m * k, 5 * s + 1), dtype);
            const b = quantize(uniform(batch * k * n, 5 * s + 2), dtype);
            const batched = (shape: number[]) => (batch > 1 ? [batch, ...shape] : shape);
            const ta = Tensor.from(a, batched(transA ? [k, m] : [m, k]), { dtype });
            const tb = Tensor.from(b, batched(transB ? [n, k] : [k, n]), { dtype });
            const expected = matmul64(a, b, dims);
            for (const tiling of tilings) {
              matmulSettings.of(gpu).tiling = tiling;
              const split = gemmSplit(gpu, tiling, dims, batch);
              const label = `${dtype} ${tilingName(tiling)} tk ${tiling.tk} ${
                JSON.stringify(dims)
              }`;
              // The split has several slices and a shorter last one.
              assert.ok(split.slices > 1, label);
              assert.ok(k - (split.slices - 1) * split.length < split.length, `${label}: uneven`);
              for (const target of [matmulSettings.of(gpu).splitKWorkgroups, 0]) {
                const chosenTarget = matmulSettings.of(gpu).splitKWorkgroups;
                matmulSettings.of(gpu).splitKWorkgroups = target;
                let c: Tensor | undefined;
                try {
                  const kernels = dispatchedKernels(() => c = matmul(ta, tb, { transA, transB }));
                  assert.equal(kernels.length, target > 0 ? 2 : 1, `${label}: ${kernels}`);
                } finally {
                  matmulSettings.of(gpu).splitKWorkgroups = chosenTarget;
                }
                const what = `${label} ${target > 0 ? `split in ${split.slices}` : "unsplit"}`;
                assertClose(await c!.read(), expected, tolFor(dtype, k), what);
                c!.dispose();
              }
            }
            ta.dispose();
            tb.dispose();
          }
        }
      } finally {
        matmulSettings.of(gpu).tiling = chosen;
      }
    });
  },
});

Deno.test({
  name: "adapter profile: a staged attention plan is halved, then dropped, where its tiles " +
    "pass the GPU's workgroup memory (16 KiB, and the GPU-like default)",
  ...GPU_TEST,
  async fn() {
    /** The stage the forward kernel runs with for a tuned plan staging 32 rows. */
    const stageFor = (dtype: "f32" | "f16", headSize: number) => {
      attentionSettings.of(gpu).plans.set(dtype, { rows: 64, stage: 32 });
      const shape = { batch: 1, t: 8, heads: 1, headSize };
      const qkv = Tensor.zeros([1, 8, 3 * headSize], { dtype });
      const keys = dispatchedKernels(() => {
        const { o, lse } = launchFlashAttention({ qkv }, shape, null);
        o.dispose();
        lse.dispose();
      });
      qkv.dispose();
      return Number(/stage=(\d+)/.exec(keys.join())?.[1]);
    };
    // Two tiles of D plus 8 bytes per staged row: f32 D = 64 at 32 rows is 16,640 B.
    await asGpu(() => {
      assert.equal(stageFor("f32", 64), 16);
      assert.equal(stageFor("f32", 128), 0, "16 rows of f32 D = 128 are 16,512 B");
      if (gpu.f16) assert.equal(stageFor("f16", 128), 16);
      return Promise.resolve();
    }, { maxComputeWorkgroupStorageSize: 16384 });
    await asGpu(() => {
      const limit = gpu.adapterProfile.limits.maxComputeWorkgroupStorageSize;
      assert.equal(stageFor("f32", 64), 32);
      assert.equal(stageFor("f32", 128), limit >= 33024 ? 32 : 16);
      return Promise.resolve();
    });
  },
});
