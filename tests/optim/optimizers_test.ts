import assert from "node:assert/strict";
import { Tensor } from "../../gpu/mod.ts";
import { Adam, type AdamOptions, AdamW, SGD, type SGDOptions } from "../../optim/mod.ts";
import { cosineSchedule, linearWarmupDecay, LrScheduler } from "../../optim/lr_schedule.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { slotsPerDispatch } from "../helpers/internals.ts";
import {
  adamRef,
  check,
  type GradDType,
  matchesReference,
  setGrads,
  setup,
  sgdRef,
  snapshot,
} from "../helpers/optimizer_reference.ts";

/**
 * Deno.test options of a test run once per gradient dtype (bf16 with bf16
 * working copies): f16 is ignored without shader-f16.
 */
function perDtype(name: string, dtype: GradDType, fn: () => Promise<void>): Deno.TestDefinition {
  const ignore = dtype === "f16" && !gpu.f16;
  return {
    name: `${name}, ${dtype} gradients${ignore ? " (ignored: the adapter has no shader-f16)" : ""}`,
    ignore,
    ...GPU_TEST,
    fn,
  };
}

for (const dtype of ["f32", "f16", "bf16"] as const) {
  Deno.test(perDtype(
    "SGD matches torch.optim.SGD: plain, momentum, Nesterov, weight decay",
    dtype,
    async () => {
      const configs: SGDOptions[] = [
        { lr: 0.1 },
        { lr: 0.05, momentum: 0.9 },
        { lr: 0.05, momentum: 0.9, nesterov: true },
        { lr: 0.05, momentum: 0.8, weightDecay: 0.01 },
        { lr: 0.1, weightDecay: 0.1 },
      ];
      for (const o of configs) {
        await matchesReference(
          JSON.stringify(o),
          (ps) => new SGD(ps, o),
          (p) => sgdRef(p, o),
          dtype,
        );
      }
    },
  ));

  Deno.test(perDtype(
    "Adam / AdamW match torch.optim.Adam / AdamW, with and without bias correction",
    dtype,
    async () => {
      const configs: AdamOptions[] = [
        { lr: 0.01 },
        { lr: 0.01, biasCorrection: false },
        { lr: 0.01, weightDecay: 0.05 }, // L2, added to the gradient
        { lr: 0.01, weightDecay: 0.05, decoupledWeightDecay: true },
        {
          lr: 0.02,
          betas: [0.5, 0.9],
          eps: 1e-6,
          weightDecay: 0.1,
          decoupledWeightDecay: true,
          biasCorrection: false,
        },
      ];
      for (const o of configs) {
        await matchesReference(
          JSON.stringify(o),
          (ps) => new Adam(ps, o),
          (p) => adamRef(p, o),
          dtype,
        );
      }
      // AdamW: PyTorch's defaults (decoupled, weight decay 0.01).
      const aw = { lr: 0.01, weightDecay: 0.01, decoupledWeightDecay: true };
      await matchesReference(
        "AdamW",
        (ps) => new AdamW(ps, { lr: 0.01 }),
        (p) => adamRef(p, aw),
        dtype,
      );
    },
  ));
}

Deno.test("gradScale multiplies the gradients inside the fused update", GPU_TEST, async () => {
  const sgd: SGDOptions = { lr: 0.05, momentum: 0.9, weightDecay: 0.01 };
  const adam: AdamOptions = { lr: 0.01, weightDecay: 0.05 };
  for (const gradScale of [0.25, 3]) {
    await matchesReference("SGD", (ps) => new SGD(ps, sgd), (p) => sgdRef(p, sgd), "f32", {
      gradScale,
    });
    await matchesReference(
      "Adam",
      (ps) => new Adam(ps, adam),
      (p) => adamRef(p, adam),
      "f32",
      {
        gradScale,
        steps: 3,
      },
    );
  }
});

Deno.test("parameter groups: per-group lr and a no-decay group", GPU_TEST, async () => {
  // Parameters 0 and 2 decay; parameter 1 (a "bias") has no decay and its own lr.
  const decay = { lr: 0.01, weightDecay: 0.1, decoupledWeightDecay: true };
  const noDecay = { ...decay, lr: 0.03, weightDecay: 0 };
  await matchesReference(
    "AdamW groups",
    ([a, b, c]) =>
      new AdamW([{ params: [a, c] }, { params: [b], weightDecay: 0, lr: 0.03 }], decay),
    (p, k) => adamRef(p, k === 1 ? noDecay : decay),
    "f32",
  );
  const sgd = { lr: 0.1, momentum: 0.9, weightDecay: 0.05 };
  await matchesReference(
    "SGD groups",
    ([a, b, c]) =>
      new SGD([{ params: [a, c] }, { params: [b], weightDecay: 0, nesterov: true }], sgd),
    (p, k) => sgdRef(p, k === 1 ? { ...sgd, weightDecay: 0, nesterov: true } : sgd),
    "f32",
  );
  const { params } = setup(3);
  const opt = new AdamW([{ params: params.slice(0, 2) }, {
    params: params.slice(2),
    weightDecay: 0,
  }]);
  assert.deepEqual(opt.groups.map((g) => g.weightDecay), [0.01, 0]);
  assert.equal(opt.params.length, 3);
});

Deno.test("LR schedules: closed-form values at key steps", GPU_TEST, () => {
  const close = (f: (s: number) => number, pairs: [number, number][]) =>
    pairs.forEach(([s, want]) =>
      assert.ok(Math.abs(f(s) - want) < 1e-12, `step ${s}: ${f(s)} != ${want}`)
    );
  close(linearWarmupDecay({ warmupSteps: 10, totalSteps: 110 }), [
    [0, 0],
    [5, 0.5],
    [10, 1],
    [60, 0.5],
    [85, 0.25],
    [110, 0],
    [1000, 0],
  ]);
  close(linearWarmupDecay({ warmupSteps: 10, totalSteps: 110, minFactor: 0.1 }), [
    [5, 0.5],
    [10, 1],
    [60, 0.55],
    [110, 0.1],
    [500, 0.1],
  ]);
  close(cosineSchedule({ warmupSteps: 10, totalSteps: 110 }), [
    [0, 0],
    [5, 0.5],
    [10, 1],
    [35, 0.8535533905932737],
    [60, 0.5],
    [85, 0.14644660940672624],
    [110, 0],
  ]);
  close(cosineSchedule({ totalSteps: 100, minFactor: 0.2 }), [[0, 1], [50, 0.6], [100, 0.2], [
    150,
    0.2,
  ]]);
  assert.throws(() => linearWarmupDecay({ warmupSteps: 20, totalSteps: 10 }), /totalSteps must be/);
  assert.throws(
    () => cosineSchedule({ totalSteps: 10, minFactor: 2 }),
    /minFactor must be in \[0, 1\]/,
  );
  assert.throws(() => cosineSchedule({ totalSteps: 10 })(-1), /step must be a finite number >= 0/);
});

Deno.test(
  "LrScheduler drives every group's lr; the optimizer follows the reference",
  GPU_TEST,
  async () => {
    // linearWarmupDecay({ warmupSteps: 2, totalSteps: 6, minFactor: 0.2 }) in closed form.
    const factors = [0, 0.5, 1, 0.8, 0.6, 0.4, 0.2, 0.2];
    const o = { lr: 0.1, momentum: 0.9 };
    const { init, params, copies } = setup(5);
    const opt = new SGD([{ params: params.slice(0, 2) }, {
      params: params.slice(2),
      lr: 0.02,
    }], o);
    opt.setWorkingCopies(copies);
    const scheduler = new LrScheduler(
      opt,
      linearWarmupDecay({ warmupSteps: 2, totalSteps: 6, minFactor: 0.2 }),
    );
    const refs = init.map((p, k) => ({ ref: sgdRef(p, o), base: k < 2 ? 0.1 : 0.02 }));
    for (const [s, f] of factors.entries()) {
      assert.equal(scheduler.stepCount, s);
      opt.groups.forEach((g, i) => assert.ok(Math.abs(g.lr - [0.1, 0.02][i] * f) < 1e-15));
      const grads = setGrads(params, s, "f32");
      opt.step();
      refs.forEach(({ ref, base }, k) => ((ref.lr = base * f), ref.step(grads[k])));
      await check(`scheduled step ${s}`, params, copies, refs.map((r) => r.ref));
      scheduler.step();
    }
    scheduler.step(1); // jump: e.g. to the count of applied (not skipped) steps
    assert.deepEqual(scheduler.lrs, [0.05, 0.01]);
    assert.throws(() => scheduler.step(-1), /step must be an integer >= 0/);
  },
);

Deno.test(
  "foundInf skips the step on the GPU: everything bit-identical, Adam's t does not advance",
  GPU_TEST,
  async () => {
    const sgd: SGDOptions = { lr: 0.05, momentum: 0.9, nesterov: true, weightDecay: 0.01 };
    const adam: AdamOptions = { lr: 0.01, weightDecay: 0.05 };
    const cases = [
      { make: (ps: Tensor[]) => new SGD(ps, sgd), ref: (p: Float64Array) => sgdRef(p, sgd) },
      {
        make: (ps: Tensor[]) => new Adam(ps, adam),
        ref: (p: Float64Array) => adamRef(p, adam),
      },
      {
        make: (ps: Tensor[]) => new AdamW(ps, { lr: 0.01 }),
        ref: (p: Float64Array) =>
          adamRef(p, { lr: 0.01, weightDecay: 0.01, decoupledWeightDecay: true }),
      },
    ];
    for (const [c, copyDtype] of cases.flatMap((c) => [[c, "f16"], [c, "bf16"]] as const)) {
      const { init, params, copies } = setup(21, copyDtype);
      const opt = c.make(params);
      opt.setWorkingCopies(copies);
      const refs = init.map(c.ref);
      for (let s = 0; s < 2; s++) {
        const grads = setGrads(params, s, "f32");
        opt.step();
        refs.forEach((r, k) => r.step(grads[k]));
      }
      const before = await snapshot(opt, params, copies);
      for (const flag of [1, Infinity, NaN, -3]) {
        setGrads(params, 99, "f32");
        const foundInf = Tensor.from([flag], [1]);
        const { reads, dispatches } = gpu.batch.counters;
        opt.step({ foundInf });
        assert.equal(gpu.batch.counters.reads, reads, "step() must not read back");
        // The updates share dispatches as the device's slots allow; + Adam's step counter.
        const slots = opt instanceof Adam
          ? slotsPerDispatch(gpu, 5, 3)
          : slotsPerDispatch(gpu, 4, 2);
        const perStep = Math.ceil(params.length / slots) + (opt instanceof Adam ? 1 : 0);
        assert.equal(gpu.batch.counters.dispatches - dispatches, perStep);
        assert.deepStrictEqual(await snapshot(opt, params, copies), before, `flag ${flag}`);
      }
      if (opt instanceof Adam) assert.equal(before.state.step, 2);
      // The next clean step is the reference's third: t = 3 in the bias correction.
      const grads = setGrads(params, 2, "f32");
      opt.step({ foundInf: Tensor.from([0], [1]) });
      refs.forEach((r, k) => r.step(grads[k]));
      await check(`${opt.constructor.name} after skipped steps`, params, copies, refs);
      if (opt instanceof Adam) assert.equal((await opt.stateDict()).step, 3);
      opt.dispose();
    }
  },
);
