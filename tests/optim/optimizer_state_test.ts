/** Optimizer state dicts (round trip, all-or-nothing loading) and every clear error. */
import assert from "node:assert/strict";
import { Tensor } from "../../gpu/mod.ts";
import {
  Adam,
  AdamW,
  cosineSchedule,
  LrScheduler,
  type OptimizerStateDict,
  SGD,
  type SGDOptions,
} from "../../optim/mod.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { CopyMap } from "../helpers/optimizer_reference.ts";
import { type Opt, setGrads, setup } from "../helpers/optimizer_reference.ts";

Deno.test(
  "stateDict -> loadStateDict into a fresh optimizer continues bit-identically",
  GPU_TEST,
  async () => {
    const makers: ((ps: Tensor[], lr: number) => Opt)[] = [
      (ps, lr) => new SGD(ps, { lr, momentum: 0.9, nesterov: true }),
      (ps, lr) => new Adam(ps, { lr, weightDecay: 0.01 }),
      (ps, lr) =>
        new AdamW([{ params: ps.slice(0, 2) }, { params: ps.slice(2), weightDecay: 0 }], { lr }),
    ];
    for (const make of makers) {
      const a = setup(31), b = setup(41);
      const optA = make(a.params, 0.01);
      for (let s = 0; s < 3; s++) setGrads(a.params, s, "f32"), optA.step();
      const saved = await optA.stateDict();
      // A fresh run with other weights and another lr: loading restores the hyper-parameters.
      const optB = make(b.params, 0.5);
      optB.loadStateDict(saved);
      b.params.forEach((p, k) => p.copyFrom(a.params[k]));
      assert.deepStrictEqual(await optB.stateDict(), saved);
      for (let s = 3; s < 6; s++) {
        setGrads(a.params, s, "f32"), setGrads(b.params, s, "f32");
        optA.step(), optB.step();
      }
      for (const [k, p] of a.params.entries()) {
        assert.deepStrictEqual(
          await b.params[k].read(),
          await p.read(),
          `${saved.kind} param ${k}`,
        );
      }
      assert.deepStrictEqual(await optB.stateDict(), await optA.stateDict());
    }
  },
);

Deno.test("bad options give clear errors", GPU_TEST, () => {
  const p = Tensor.from([1, 2], [2]), q = Tensor.from([3], [1]);
  const sgd = (o: object, ps: unknown = [p]) => () => new SGD(ps as Tensor[], o as SGDOptions);
  const adam = (o: object, ps: unknown = [p]) => () => new Adam(ps as Tensor[], o);
  assert.throws(sgd({ lr: -1 }), /lr must be a finite number >= 0, got -1/);
  assert.throws(sgd({}), /lr must be a finite number >= 0, got undefined/);
  assert.throws(sgd({ lr: 0.1, momentum: 1 }), /momentum must be in \[0, 1\), got 1/);
  assert.throws(sgd({ lr: 0.1, momentum: -0.1 }), /momentum must be in \[0, 1\)/);
  assert.throws(sgd({ lr: 0.1, nesterov: true }), /nesterov needs momentum > 0/);
  assert.throws(sgd({ lr: 0.1, weight_decay: 0.1 }), /unknown option weight_decay/);
  assert.throws(adam({ betas: [1, 0.999] }), /betas must be two numbers in \[0, 1\)/);
  assert.throws(adam({ betas: [0.9, -0.1] }), /betas must be two numbers in \[0, 1\)/);
  assert.throws(adam({ eps: -1 }), /eps must be a finite number >= 0/);
  assert.throws(adam({ weightDecay: -0.1 }), /weightDecay must be a finite number >= 0/);
  assert.throws(adam({ biasCorrection: "yes" }), /biasCorrection must be a boolean/);
  // Every problem in one message.
  assert.throws(
    adam({ lr: -1, betas: [2, 0] }),
    (e: Error) => /lr must/.test(e.message) && /betas must/.test(e.message),
  );
  assert.throws(adam({}, [{ params: [p] }, { params: [q], lr: -1 }]), /group 1: lr must be/);
  assert.throws(
    adam({}, [Tensor.from([1], [1], { dtype: "f16" })]),
    /optimizers update fp32 master weights/,
  );
  assert.throws(adam({}, []), /empty parameter list/);
  assert.throws(adam({}, new Set([p])), /params must be an array/);
  assert.throws(adam({}, [p, p]), /appears twice/);
  assert.throws(
    adam({}, [{ params: [p] }, { params: [q] }, { params: [p] }]),
    /group 2: parameter f32 \[2\] appears twice/,
  );

  const opt = new Adam([p, q], { lr: 0.1 });
  assert.throws(
    () => opt.setWorkingCopies(new CopyMap([[p, Tensor.zeros([3])]])),
    /the copy of f32 \[2\] is f32 \[3\]/,
  );
  assert.throws(
    () => opt.setWorkingCopies(new CopyMap([[Tensor.zeros([1]), q]])),
    /is not a parameter/,
  );
  p.grad = Tensor.zeros([3]);
  assert.throws(() => opt.step(), /the gradient of f32 \[2\] is f32 \[3\]/);
  p.grad = p.share();
  assert.throws(() => opt.step(), /the gradient of f32 \[2\] shares memory with it/);
  p.grad = Tensor.zeros([2]);
  assert.throws(
    () => opt.step({ foundInf: Tensor.zeros([2]) }),
    /signals.foundInf must be a live f32 tensor of one element/,
  );
  opt.groups[0].lr = -0.5;
  assert.throws(() => opt.step(), /group 0: lr must be a finite number >= 0, got -0.5/);
  opt.dispose();
  assert.throws(() => opt.step(), /Adam.step: the optimizer was disposed/);
});

Deno.test(
  "a gradient error dispatches nothing; parameters without a gradient are left alone",
  GPU_TEST,
  async () => {
    const { params } = setup(51);
    const opt = new Adam(params, { lr: 0.1 });
    const before = await Promise.all(params.map((p) => p.read()));
    setGrads(params, 0, "f32");
    params[2].grad = Tensor.zeros([5]);
    assert.throws(() => opt.step());
    params[2].grad.dispose(), params[2].grad = null;
    assert.deepStrictEqual(await opt.stateDict().then((s) => s.step), 0);
    opt.step(); // only parameters 0 and 1 have gradients
    assert.deepStrictEqual(await params[2].read(), before[2]);
    assert.notDeepStrictEqual(await params[0].read(), before[0]);
    opt.zeroGrad();
    assert.ok(params.every((p) => p.grad === null));
    opt.step(); // nothing to do: t stays
    assert.equal((await opt.stateDict()).step, 1);
  },
);

Deno.test(
  "mismatched state dicts: one error lists every problem and nothing changes",
  GPU_TEST,
  async () => {
    const { params } = setup(61);
    const adam = new Adam(params, { lr: 0.01 });
    setGrads(params, 0, "f32"), adam.step();
    const good = await adam.stateDict();
    const sgdState = await new SGD(params, { lr: 0.1, momentum: 0.9 }).stateDict();
    const other = await new Adam([Tensor.zeros([1]), Tensor.zeros([8]), Tensor.zeros([1031])])
      .stateDict();
    const adamW = await new AdamW(params).stateDict();
    const edit = (f: (s: OptimizerStateDict) => void) => {
      const s = structuredClone(good);
      f(s);
      return s;
    };
    const cases: [OptimizerStateDict, RegExp[]][] = [
      // Another optimizer's state: the kind alone is the cause (its settings and buffers differ too).
      [sgdState, [/: it is the state of "SGD", this optimizer is "Adam"\.$/]],
      [other, [/parameter 1 \(f32 \[7\]\): saved shape \[8\]/]],
      [adamW, [/setting decoupledWeightDecay is true, this optimizer has false/]],
      [edit((s) => (s.state[2].buffers.expAvg = new Float32Array(3))), [
        /buffer expAvg must be a Float32Array of 1031 values/,
      ]],
      [edit((s) => delete s.state[0].buffers.expAvgSq), [
        /parameter 0 \(f32 \[1\]\): buffers \[expAvg\]/,
      ]],
      [edit((s) => (s.step = -1)), [/step must be an integer/]],
      [edit((s) => (s.groups[0].hyper.betas = [0.9, 1.5])), [/group 0: betas must be two numbers/]],
      [edit((s) => s.groups.push({ params: [], hyper: {} })), [/2 groups, expected 1/]],
      [edit((s) => (s.groups[0].params = [0, 2, 1])), [
        /group 0 holds parameters \[0,2,1\], expected \[0,1,2\]/,
      ]],
      [edit((s) => (s.state = s.state.slice(1))), [/2 parameter states, expected 3/]],
      // Several problems at once: all of them in one message.
      [edit((s) => ((s.step = 1.5), (s.state[1].shape = [9]), (s.groups[0].hyper.lr = -1))), [
        /step must be an integer/,
        /saved shape \[9\]/,
        /lr must be/,
      ]],
    ];
    for (const [state, patterns] of cases) {
      assert.throws(() => adam.loadStateDict(state), (e: Error) => {
        assert.match(
          e.message,
          /Adam.loadStateDict: the state dict does not match this optimizer; nothing was loaded/,
        );
        for (const re of patterns) assert.match(e.message, re);
        return true;
      });
    }
    assert.deepStrictEqual(await adam.stateDict(), good);
  },
);

Deno.test(
  "state values: a negative expAvgSq or a NaN moment is refused (checkStateDict and " +
    "loadStateDict, nothing changes); allowNonFinite loads NaN but never a negative second moment",
  GPU_TEST,
  async () => {
    const { params } = setup(71);
    const adam = new Adam(params, { lr: 0.01 });
    setGrads(params, 0, "f32"), adam.step();
    const good = await adam.stateDict();
    const negative = structuredClone(good), nan = structuredClone(good);
    negative.state[2].buffers.expAvgSq[5] = -1e-3;
    nan.state[1].buffers.expAvg[0] = NaN;
    const refused = (state: OptimizerStateDict, re: RegExp, options = {}) => {
      assert.throws(() => adam.checkStateDict(state, options), re);
      assert.throws(() => adam.loadStateDict(state, options), re);
    };
    refused(negative, /parameter 2 \(f32 \[1031\]\): buffer expAvgSq holds 1 negative value/);
    refused(negative, /expAvgSq holds 1 negative value/, { allowNonFinite: true });
    refused(nan, /parameter 1 \(f32 \[7\]\): buffer expAvg holds 1 non-finite value/);
    assert.deepStrictEqual(await adam.stateDict(), good);
    adam.checkStateDict(good); // fits: returns, changes nothing
    adam.loadStateDict(nan, { allowNonFinite: true });
    assert.ok(Number.isNaN((await adam.stateDict()).state[1].buffers.expAvg[0]));
  },
);

Deno.test(
  "LrScheduler: stateDict round trip restores base lrs and step; a bad state is refused first",
  () => {
    const schedule = cosineSchedule({ warmupSteps: 2, totalSteps: 10 });
    const a = { groups: [{ lr: 0.1 }, { lr: 0.02 }] }, b = { groups: [{ lr: 9 }, { lr: 9 }] };
    const scheduler = new LrScheduler(a, schedule);
    for (let i = 0; i < 4; i++) scheduler.step();
    const state = scheduler.stateDict();
    assert.deepEqual(JSON.parse(JSON.stringify(state)), {
      baseLrs: [0.1, 0.02],
      step: 4,
      schedule: { name: "cosine", warmupSteps: 2, totalSteps: 10, minFactor: 0 },
    });
    const resumed = new LrScheduler(b, schedule); // made with other lrs: the file's win
    for (
      const [bad, re] of [
        [{ baseLrs: [0.1], step: 4 }, /baseLrs must be 2 finite number\(s\) >= 0, one per group/],
        [{ baseLrs: [0.1, -1], step: 4 }, /baseLrs must be/],
        [{ baseLrs: [0.1, 0.02], step: "4" }, /step must be an integer >= 0, got string/],
        [{ baseLrs: [0.1, 0.02], step: 1.5 }, /step must be an integer >= 0, got 1.5/],
      ] as const
    ) {
      assert.throws(() => resumed.loadStateDict(bad as never), re);
      assert.deepEqual([resumed.stepCount, resumed.baseLrs, b.groups], [0, [9, 9], [
        { lr: 0 },
        { lr: 0 },
      ]]);
    }
    resumed.loadStateDict(state);
    assert.deepEqual([resumed.stepCount, resumed.lrs], [4, scheduler.lrs]);
    scheduler.step(), resumed.step();
    assert.deepEqual(resumed.lrs, scheduler.lrs);
  },
);
