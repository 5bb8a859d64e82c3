/**
 * Multi-tensor dispatches (gpu/kernels/multi_tensor.ts): the once-per-parameter
 * work of a step (unscale, gradient norm, clipping, optimizer updates) runs
 * several tensors per dispatch. Results must not depend on how many share a
 * dispatch (compared bit for bit with one tensor per dispatch), must match
 * the f64 references, and an overflow in any tensor must skip the whole step.
 */
import assert from "node:assert/strict";
import { GradScaler } from "../../../amp/mod.ts";
import { Tensor } from "../../../gpu/mod.ts";
import {
  multiTensorChunks,
  multiTensorSettings,
  slotsPerDispatch,
  slotTable,
} from "../../../gpu/kernels/multi_tensor.ts";
import { Adam, type AdamOptions, clipGradNorm, SGD, type SGDOptions } from "../../../optim/mod.ts";
import { adamKernel } from "../../helpers/internals.ts";
import { asGpu, dispatchedKernels, gpu, GPU_TEST } from "../../helpers/gpu.ts";
import {
  adamRef,
  check,
  CopyMap,
  type Opt,
  type Ref,
  sgdRef,
} from "../../helpers/optimizer_reference.ts";
import { assertClose, TOL } from "../../helpers/assert.ts";
import { quantize, uniform } from "../../helpers/reference.ts";

// 21 tensors: more than one dispatch holds anywhere, with odd sizes, an
// empty one, and one past a workgroup's 1024-element span.
const SIZES = [1, 7, 1031, 0, 33, 4097, 2, 129, 64, 5, 1, 300, 17, 1024, 1025, 3, 8, 9, 65, 2, 511];
const F16 = gpu.f16;
/** Gradient dtypes by tensor: f16 and f32 mixed (a run changes dtype mid-list) where f16 exists. */
const gradDtype = (k: number) => F16 && k % 5 >= 3 ? "f16" : "f32";

/** Runs `fn` with at most `slots` tensors per dispatch, then restores the device's setting. */
function withSlots<T>(slots: number, fn: () => T): T {
  const settings = multiTensorSettings.of(gpu), chosen = settings.slots;
  settings.slots = slots;
  try {
    return fn();
  } finally {
    settings.slots = chosen;
  }
}

function makeParams(seed: number) {
  const init = SIZES.map((n, k) => quantize(uniform(n, seed + k), "f32"));
  const params = init.map((v) => Tensor.from(v, [v.length]));
  const copies = new CopyMap();
  if (F16) params.forEach((p, k) => copies.set(p, Tensor.from(init[k], p.shape, { dtype: "f16" })));
  return { init, params, copies };
}

function setGrads(params: Tensor[], step: number, poison?: { k: number; value: number }) {
  return params.map((p, k) => {
    const g = quantize(uniform(p.size, 7919 * (step + 1) + k, -2, 2), gradDtype(k));
    if (poison?.k === k) g[Math.floor(g.length / 2)] = poison.value;
    p.grad?.dispose();
    p.grad = Tensor.from(g, p.shape, { dtype: gradDtype(k) });
    return g;
  });
}

async function everything(opt: Opt, params: Tensor[], copies: CopyMap) {
  return {
    state: await opt.stateDict(),
    masters: await Promise.all(params.map((p) => p.read())),
    copies: await Promise.all([...copies.values()].map((c) => c.read())),
  };
}

const OPTIMIZERS: {
  name: string;
  make: (ps: Tensor[]) => Opt;
  ref: (p: Float64Array) => Ref;
}[] = [
  {
    name: "SGD, Nesterov",
    make: (ps) => new SGD(ps, SGD_OPTIONS),
    ref: (p) => sgdRef(p, SGD_OPTIONS),
  },
  {
    name: "SGD, plain",
    make: (ps) => new SGD(ps, { lr: 0.1 }),
    ref: (p) => sgdRef(p, { lr: 0.1 }),
  },
  { name: "AdamW", make: (ps) => new Adam(ps, ADAMW), ref: (p) => adamRef(p, ADAMW) },
];
const SGD_OPTIONS: SGDOptions = { lr: 0.05, momentum: 0.9, nesterov: true, weightDecay: 0.01 };
const ADAMW: AdamOptions = { lr: 0.01, weightDecay: 0.05, decoupledWeightDecay: true };

Deno.test(
  "multi-tensor: optimizer updates match f64 and give the same bits with 1, 3 and 16 tensors per dispatch",
  GPU_TEST,
  async () => {
    for (const o of OPTIMIZERS) {
      const results = [];
      for (const slots of [1, 3, 16]) {
        const { init, params, copies } = makeParams(3);
        const opt = o.make(params);
        opt.setWorkingCopies(copies);
        const refs = init.map(o.ref);
        const gradScale = Tensor.from([0.5], [1]);
        for (let s = 0; s < 3; s++) {
          const grads = setGrads(params, s);
          withSlots(slots, () => opt.step({ gradScale }));
          refs.forEach((r, k) => r.step(grads[k].map((g) => g * 0.5)));
        }
        await check(`${o.name}, ${slots} per dispatch`, params, copies, refs);
        results.push(await everything(opt, params, copies));
        opt.dispose();
      }
      assert.deepStrictEqual(results[1], results[0], `${o.name}: 3 per dispatch vs 1`);
      assert.deepStrictEqual(results[2], results[0], `${o.name}: 16 per dispatch vs 1`);
    }
  },
);

Deno.test(
  "multi-tensor: an overflow in any tensor of any dispatch skips every update; dispatches per step",
  GPU_TEST,
  async () => {
    const poisons = [
      { k: 1, value: Infinity }, // the first dispatch
      { k: SIZES.length - 2, value: NaN }, // the last one
      ...(F16 ? [{ k: 13, value: -Infinity }] : []), // an f16 gradient
    ];
    for (const poison of poisons) {
      const { params, copies } = makeParams(9);
      const opt = new Adam(params, ADAMW);
      opt.setWorkingCopies(copies);
      const scaler = new GradScaler({ initScale: 4 });
      setGrads(params, 0);
      scaler.step(opt);
      scaler.update();
      const before = await everything(opt, params, copies);
      setGrads(params, 1, poison);
      const { dispatches, reads } = gpu.batch.counters;
      // Unscale (finds the overflow), then the skipped update, 16 tensors per dispatch at most.
      withSlots(16, () => scaler.step(opt));
      assert.equal(gpu.batch.counters.reads, reads, "a step must not read back");
      // Unscale and the updates run one dispatch per run of tensors of one
      // dtype (and copy dtype) that fits the device's slots; plus Adam's step count.
      const unscaleRuns = withSlots(16, () => runs(slotsPerDispatch(gpu, 1, 2)));
      const updateRuns = withSlots(16, () => runs(slotsPerDispatch(gpu, 5, 3)));
      assert.ok(updateRuns < SIZES.length - 1, "several tensors share a dispatch");
      assert.equal(gpu.batch.counters.dispatches - dispatches, unscaleRuns + 1 + updateRuns);
      scaler.update();
      assert.equal(await scaler.lastStepSkipped(), true, `poison in tensor ${poison.k}`);
      assert.deepStrictEqual(await everything(opt, params, copies), before);
      opt.dispose();
      scaler.dispose();
    }
  },
);

/** Dispatches over the non-empty tensors (empty ones dispatch nothing) at `slots` per dispatch. */
function runs(slots: number): number {
  const dtypes = SIZES.flatMap((n, k) => n > 0 ? [gradDtype(k)] : []);
  return multiTensorChunks(dtypes, slots, (d) => d).length;
}

Deno.test(
  "multi-tensor: unscale and clip by global norm match f64 and give the same bits at any slot count",
  GPU_TEST,
  async () => {
    const outcomes = [];
    for (const slots of [1, 16]) {
      const { params } = makeParams(5);
      const grads = setGrads(params, 4).map((g) => g.map((v) => v * 8));
      params.forEach((p, k) => {
        p.grad!.dispose();
        p.grad = Tensor.from(grads[k], p.shape, { dtype: gradDtype(k) });
      });
      const opt = new SGD(params, { lr: 0 }); // only carries the parameter list
      const scaler = new GradScaler({ initScale: 8 });
      withSlots(slots, () => scaler.unscale(opt));
      const { totalNorm } = withSlots(slots, () => clipGradNorm(params, 1.0));
      // f64: unscaling by a power of two is exact; the norm of the unscaled values.
      const norm = Math.sqrt(
        grads.flat().reduce((s, g) => s + g.reduce((a, v) => a + (v / 8) ** 2, 0), 0),
      );
      assertClose(await totalNorm.read(), [norm], TOL.f32, "global norm");
      const clipped = await Promise.all(params.map((p) => p.grad!.read()));
      clipped.forEach((c, k) => {
        const expected = grads[k].map((v) => (v / 8) * Math.min(1, 1 / (norm + 1e-6)));
        assertClose(c, expected, TOL[gradDtype(k)], `clipped gradient ${k}`);
      });
      outcomes.push({ norm: await totalNorm.read(), clipped });
      opt.dispose();
      scaler.dispose();
    }
    assert.deepStrictEqual(outcomes[1], outcomes[0]);
  },
);

Deno.test("multi-tensor: chunks keep order and split on a new key; slot tables", () => {
  const items = ["a", "a", "a", "b", "b", "a", "a"];
  assert.deepEqual(multiTensorChunks(items, 2, (x) => x), [["a", "a"], ["a"], ["b", "b"], [
    "a",
    "a",
  ]]);
  const table = slotTable([5, 0, 3000], [1, 0, 3]);
  assert.equal(table.workgroups, 4);
  assert.deepEqual([table.uniforms.wg0, table.uniforms.wg1, table.uniforms.wg2], [0, 1, 1]);
  assert.equal(table.uniforms.wg3, 4, "unused slots start at the end");
  assert.deepEqual([table.uniforms.n0, table.uniforms.n1, table.uniforms.n2], [5, 0, 3000]);
  // The device's storage-buffer limit bounds the slots: 32 on lavapipe leaves 5 for Adam with copies.
  const limit = gpu.device.limits.maxStorageBuffersPerShaderStage;
  assert.equal(
    withSlots(16, () => slotsPerDispatch(gpu, 5, 3)),
    Math.max(1, Math.min(16, Math.floor((limit - 3) / 5))),
  );
  assert.equal(withSlots(1, () => slotsPerDispatch(gpu, 1, 1)), 1);
});

// 17 tensors of one gradient dtype (f16 where the adapter has it, with f16 working copies):
// every dispatch but the last is full at a GPU's slot count.
const FULL = [1, 7, 1031, 33, 4097, 2, 129, 64, 5, 300, 17, 1024, 1025, 3, 8, 9, 65];
const FULL_GRAD = F16 ? "f16" : "f32";

/** The `slots` of each dispatch of kernel family `name` among `keys`. */
function slotsOf(keys: string[], name: string): number[] {
  return keys.filter((k) => k.startsWith(`${name}{`)).map((k) => Number(/slots=(\d+)/.exec(k)![1]));
}

/** The slots each dispatch should take: full runs of the most the profile allows, then the rest. */
function fullRuns(perTensor: number, shared: number): number[] {
  const limit = gpu.adapterProfile.limits.maxStorageBuffersPerShaderStage;
  const most = Math.min(16, Math.floor((limit - shared) / perTensor));
  const runs = Array(Math.floor(FULL.length / most)).fill(most);
  return FULL.length % most ? [...runs, FULL.length % most] : runs;
}

/** Two steps of `o` with unscaling by a GradScaler and clipping, as a GPU runs them (or one tensor a dispatch). */
async function gpuStyleRun(o: (typeof OPTIMIZERS)[number], onGpu: boolean) {
  const init = FULL.map((n, k) => quantize(uniform(n, 40 + k), "f32"));
  const params = init.map((v) => Tensor.from(v, [v.length]));
  const copies = new CopyMap();
  if (F16) params.forEach((p, k) => copies.set(p, Tensor.from(init[k], p.shape, { dtype: "f16" })));
  const opt = o.make(params);
  opt.setWorkingCopies(copies);
  const scaler = new GradScaler({ initScale: 4 });
  const refs = init.map(o.ref);
  const keys: string[] = [];
  const step = async (s: number) => {
    const grads = params.map((p, k) => {
      const g = quantize(uniform(p.size, 977 * (s + 1) + k, -8, 8), FULL_GRAD);
      p.grad?.dispose();
      p.grad = Tensor.from(g, p.shape, { dtype: FULL_GRAD });
      return g;
    });
    keys.push(...dispatchedKernels(() => {
      scaler.unscale(opt);
      clipGradNorm(params, 1e6).totalNorm.dispose(); // a norm, no clipping: the references stay plain
      scaler.step(opt);
      scaler.update();
    }));
    refs.forEach((r, k) => r.step(grads[k].map((g) => g / 4)));
    await check(
      `${o.name}, ${onGpu ? "as on a GPU" : "one per dispatch"}, step ${s}`,
      params,
      copies,
      refs,
    );
  };
  const run = async () => {
    for (let s = 0; s < 2; s++) await step(s);
  };
  if (onGpu) await asGpu(run);
  else await withSlots(1, run);
  const outcome = await everything(opt, params, copies);
  opt.dispose();
  scaler.dispose();
  return { outcome, keys };
}

Deno.test(
  "multi-tensor, as on a GPU: SGD, Adam and AdamW updates, unscale and clipping fill every slot " +
    "the device allows (16, as many as its storage bindings allow), match f64 " +
    "and give the bits of one tensor per dispatch",
  GPU_TEST,
  async () => {
    const optimizers = [
      ...OPTIMIZERS.filter((o) => o.name !== "SGD, plain"),
      {
        name: "Adam",
        make: (ps: Tensor[]) => new Adam(ps, ADAM),
        ref: (p: Float64Array) => adamRef(p, ADAM),
      },
    ];
    for (const o of optimizers) {
      const one = await gpuStyleRun(o, false);
      const many = await gpuStyleRun(o, true);
      assert.deepStrictEqual(
        many.outcome,
        one.outcome,
        `${o.name}: as on a GPU vs one per dispatch`,
      );
      // Two steps; unscale (a gradient a slot, beside the scale and the flag) and every kernel at
      // its most: 16 a dispatch where the device's storage bindings allow (Deno's lavapipe allows
      // 32; Dawn's, 16, leaves unscale 14).
      const sgd = o.name.startsWith("SGD");
      const update = sgd ? fullRuns(4, 2) : fullRuns(5, 3);
      const twice = (runs: number[]) => [...runs, ...runs];
      assert.deepEqual(slotsOf(many.keys, "grad_scaler_unscale"), twice(fullRuns(1, 2)), o.name);
      assert.deepEqual(slotsOf(many.keys, sgd ? "fused_sgd" : "fused_adam"), twice(update), o.name);
      assert.ok(slotsOf(one.keys, "grad_scaler_unscale").every((s) => s === 1));
    }
  },
);
const ADAM: AdamOptions = { lr: 0.01, weightDecay: 0.01 };

Deno.test(
  "multi-tensor: the 16-slot Adam kernel a GPU runs (83 storage bindings: lavapipe allows 32) " +
    "is valid WGSL that updates every slot from its own buffers",
  GPU_TEST,
  async () => {
    const wgsl = adamKernel.wgsl({
      grad: FULL_GRAD,
      copy: F16 ? "f16" : "none",
      slots: 16,
      decoupled: true,
      biasCorrection: true,
    });
    assert.equal(wgsl.match(/var<storage/g)?.length, 16 * (F16 ? 5 : 4) + 3);
    gpu.device.pushErrorScope("validation");
    gpu.device.createShaderModule({ code: wgsl });
    const error = await gpu.device.popErrorScope();
    assert.equal(error, null, error?.message);
    for (let k = 0; k < 16; k++) {
      const body = wgsl.split(`case ${k}u: {`)[1]?.split(/case \d+u: \{|default: \{\}/)[0] ?? "";
      for (const name of ["param", "grad", "exp_avg", "exp_avg_sq", ...(F16 ? ["copy"] : [])]) {
        // Directly (`grad3[i]`) or through the dtype accessors (`ld_grad3(i)`, `st_copy3(i, …)`).
        const access = new RegExp(`\\b(${name}${k}\\[i\\]|(ld|st)_${name}${k}\\(i\\b)`);
        assert.match(body, access, `slot ${k} reads ${name}${k}`);
      }
      assert.match(wgsl, new RegExp(`if \\(all_wg >= p\\.wg${k + 1}\\) \\{ slot = ${k + 1}u; \\}`));
    }
  },
);

Deno.test("multi-tensor: a full table of 16 tensors gives every slot its workgroups", () => {
  const sizes = Array.from({ length: 16 }, (_, k) => 60 * (k + 1));
  const table = slotTable(sizes, sizes.map((n) => Math.ceil(n / 1024)));
  assert.equal(table.workgroups, 16);
  for (let k = 0; k <= 16; k++) assert.equal(table.uniforms[`wg${k}`], k, `wg${k}`);
  assert.equal(table.uniforms.n15, 960);
});
