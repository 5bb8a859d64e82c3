import assert from "node:assert/strict";
import type { Optimizer, StepSignals } from "../../optim/mod.ts";
import { GradScaler, type GradScalerOptions } from "../../amp/grad_scaler.ts";
import { launchCopy, launchUnary } from "../helpers/internals.ts";
import { DTYPES, type FloatDType, mul, sum, Tensor } from "../../gpu/mod.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { quantize, rng } from "../helpers/reference.ts";
import { DEFAULT_RULE, ReferenceScaler, type ScalerRule } from "../helpers/scaler_reference.ts";

const F32_MAX = 3.4028234663852886e38;
/** The largest finite bf16, (2 − 2⁻⁷)·2¹²⁷. */
const BF16_MAX = (2 - 2 ** -7) * 2 ** 127;

/** An optimizer that only records what it was given: a GPU copy of foundInf at step time. */
class FakeOptimizer implements Optimizer {
  readonly params: Tensor[];
  seen: Tensor[] = [];
  signals: (StepSignals | undefined)[] = [];
  constructor(params: Tensor[]) {
    this.params = params;
  }
  step(signals?: StepSignals): void {
    this.signals.push(signals);
    if (signals?.foundInf) this.seen.push(Tensor.adopt(launchCopy(signals.foundInf)));
  }
  zeroGrad(): void {
    for (const p of this.params) p.grad?.dispose(), p.grad = null;
  }
  setWorkingCopies(): void {}
  async seenFlags(): Promise<number[]> {
    const flags = await Promise.all(this.seen.map((t) => t.item()));
    for (const t of this.seen) t.dispose();
    this.seen = [];
    return flags;
  }
}

/** A parameter whose gradient is `grad` (uploaded as `dtype`). */
function paramWithGrad(grad: ArrayLike<number>, dtype: FloatDType = "f32"): Tensor {
  const p = Tensor.zeros([grad.length]);
  p.grad = Tensor.from(grad, [grad.length], { dtype });
  return p;
}

const STEP_GRAD: Record<string, number[]> = {
  clean: [1, -2, 3],
  inf: [1, Infinity, 3],
  ninf: [-Infinity, 0, 3],
  nan: [1, 2, NaN],
};

/** Runs `steps` through a scaler and the reference, comparing the state after every update. */
async function runTrajectory(options: Partial<ScalerRule>, steps: string[]): Promise<void> {
  const scaler = new GradScaler(options);
  const ref = new ReferenceScaler({ ...DEFAULT_RULE, ...options });
  const opt = new FakeOptimizer([paramWithGrad(STEP_GRAD.clean)]);
  try {
    for (const [i, step] of steps.entries()) {
      // "kind" or "kind>S": gradients of that kind, then update() or update(S).
      const [kind, set] = step.split(">");
      opt.params[0].grad!.dispose();
      opt.params[0].grad = Tensor.from(STEP_GRAD[kind], [3]);
      scaler.step(opt);
      if (set === undefined) scaler.update(), ref.update(kind !== "clean");
      else scaler.update(Number(set)), ref.set(Number(set), kind !== "clean");
      const s = await scaler.stateDict();
      const at = `step ${i} (${step}) of ${steps.join(",")} with ${JSON.stringify(options)}`;
      assert.deepEqual(
        [s.scale, s.growthTracker, s.hysteresisLeft, s.skippedSteps],
        [ref.scale, ref.growthTracker, ref.hysteresisLeft, ref.skippedSteps],
        at,
      );
      assert.equal(await scaler.lastStepSkipped(), ref.lastSkipped, at);
      assert.deepEqual(await opt.seenFlags(), [kind === "clean" ? 0 : 1], at);
      assert.equal(await scaler.foundInf.item(), 0, `found_inf is reset: ${at}`);
    }
  } finally {
    scaler.dispose();
    opt.zeroGrad();
  }
}

const c = (n: number) => Array(n).fill("clean");

Deno.test("GradScaler: dynamic trajectory matches the rule (growth, backoff, NaN, -Inf)", {
  ...GPU_TEST,
}, async () => {
  await runTrajectory({ initScale: 2 ** 10, growthInterval: 3 }, [
    ...c(3), // grows after exactly 3 clean steps
    ...c(2),
    "inf", // backoff, tracker reset
    ...c(3),
    "nan",
    "ninf",
    ...c(4),
  ]);
});

Deno.test("GradScaler: hysteresis 2 tolerates one overflow, re-armed only by growth", {
  ...GPU_TEST,
}, async () => {
  await runTrajectory({ initScale: 2 ** 10, growthInterval: 3, hysteresis: 2 }, [
    "inf", // tolerated: scale kept, step still skipped
    ...c(2),
    "inf", // counter not re-armed by clean steps: backs off
    "inf", // exhausted: backs off again
    ...c(3), // growth re-arms the counter
    "inf", // tolerated again
    "clean",
  ]);
});

Deno.test("GradScaler: min/max clamps, never grows to inf, static mode never changes", {
  ...GPU_TEST,
}, async () => {
  await runTrajectory({ initScale: 2 ** 11, maxScale: 2 ** 12, growthInterval: 1 }, c(4));
  await runTrajectory({ initScale: 2 ** 9, minScale: 2 ** 8 }, ["inf", "inf", "nan", "clean"]);
  await runTrajectory({ initScale: 2 ** 127, maxScale: F32_MAX, growthInterval: 1 }, c(3));
  await runTrajectory({ initScale: 1.5 * 2 ** 127, maxScale: F32_MAX, growthInterval: 2 }, c(4));
  await runTrajectory({ lossScale: 2 ** 8, growthInterval: 1 }, [...c(2), "inf", ...c(2), "nan"]);
  const scaler = new GradScaler({ initScale: 2 ** 127, maxScale: F32_MAX, growthInterval: 1 });
  const opt = new FakeOptimizer([paramWithGrad([1])]);
  for (let i = 0; i < 3; i++) scaler.step(opt), scaler.update();
  assert.equal(await scaler.getScale(), 2 ** 127);
  scaler.dispose();
  opt.zeroGrad();
});

Deno.test(
  "GradScaler: 80 seeded steps, overflows in runs and alone, follow the rule step by step",
  {
    ...GPU_TEST,
  },
  async () => {
    // Overflow runs of 1–3 steps between clean runs of 0–7: growth (interval 3) is reached,
    // interrupted one step short, and hysteresis 2 is used up and re-armed; the scale meets
    // the ceiling 2^13 and the floor 2^8 on the way.
    const random = rng(7), steps: string[] = [];
    while (steps.length < 80) {
      steps.push(...c(Math.floor(random() * 8)));
      const run = 1 + Math.floor(random() * 3);
      for (let i = 0; i < run; i++) steps.push(["inf", "nan", "ninf"][Math.floor(random() * 3)]);
    }
    const options = {
      initScale: 2 ** 11,
      growthInterval: 3,
      hysteresis: 2,
      minScale: 2 ** 8,
      maxScale: 2 ** 13,
    };
    await runTrajectory(options, steps);
    // The sequence reaches both clamps (the reference says so, not the scaler).
    const ref = new ReferenceScaler({ ...DEFAULT_RULE, ...options }), seen = new Set<number>();
    for (const kind of steps) ref.update(kind !== "clean"), seen.add(ref.scale);
    assert.ok(seen.has(2 ** 8) && seen.has(2 ** 13), [...seen].join());
  },
);

Deno.test(
  "GradScaler: update(newScale) between steps sets the scale and keeps the growth tracker and hysteresis (PyTorch's rule)",
  {
    ...GPU_TEST,
  },
  async () => {
    await runTrajectory({ initScale: 2 ** 10, growthInterval: 3, hysteresis: 2 }, [
      "clean",
      "clean>4096", // tracker 2 kept: the next clean step grows from 4096
      "clean",
      "inf", // hysteresis 2 → 1: no backoff
      "nan>512", // skipped and counted; hysteresis left at 1, tracker at 0
      "inf", // 1 → 0: backs off from 512
      ...c(3),
    ]);
  },
);

Deno.test(
  "GradScaler: two optimizers over several steps: an overflow in one optimizer's gradients skips both (one shared flag), once; the next step runs both",
  {
    ...GPU_TEST,
  },
  async () => {
    const scaler = new GradScaler({ initScale: 2 ** 10, growthInterval: 2 });
    const ref = new ReferenceScaler({ ...DEFAULT_RULE, initScale: 2 ** 10, growthInterval: 2 });
    const a = new FakeOptimizer([paramWithGrad([1, 2])]),
      b = new FakeOptimizer([paramWithGrad([3])]);
    // Which optimizer's gradients overflow at each step.
    const steps: ("none" | "a" | "b" | "both")[] = [
      "none",
      "b",
      "none",
      "a",
      "none",
      "none",
      "both",
    ];
    try {
      for (const [i, broken] of steps.entries()) {
        for (const [name, opt] of [["a", a], ["b", b]] as const) {
          const bad = broken === name || broken === "both";
          opt.params[0].grad!.dispose();
          opt.params[0].grad = Tensor.from(bad ? [Infinity, 1] : [1, 2], [2]);
        }
        // Both unscaled before either steps (as before clipping every parameter group).
        scaler.unscale(a);
        scaler.unscale(b);
        scaler.step(a);
        scaler.step(b);
        scaler.update();
        ref.update(broken !== "none");
        const flag = broken === "none" ? 0 : 1;
        const at = `step ${i} (${broken})`;
        assert.deepEqual([await a.seenFlags(), await b.seenFlags()], [[flag], [flag]], at);
        const s = await scaler.stateDict();
        assert.deepEqual(
          [s.scale, s.growthTracker, s.skippedSteps],
          [ref.scale, ref.growthTracker, ref.skippedSteps],
          at,
        );
      }
    } finally {
      scaler.dispose();
      a.zeroGrad();
      b.zeroGrad();
    }
  },
);

/** Values of f16 storage with the padding half of an odd length left dirty (a kernel output). */
async function dirtyOddF16(values: number[]): Promise<Tensor> {
  assert.equal(values.length % 2, 1);
  const src = Tensor.from(values, [values.length]);
  const poison = Tensor.from(new Array(values.length + 1).fill(Infinity), [values.length + 1], {
    dtype: "f16",
  });
  poison.dispose(); // its buffer is the next one of its size class handed out
  const g = Tensor.adopt(launchUnary("identity", src, { out: "f16" }));
  src.dispose();
  const raw = new Uint16Array(await gpu.readBuffer(g.buffer, (values.length + 1) * 2));
  assert.equal(raw[values.length], 0x7c00, "precondition: the padding half holds +inf bits");
  return g;
}

/** Values of bf16 storage with the padding half of an odd length holding +Inf bits. */
async function dirtyOddBf16(values: number[]): Promise<Tensor> {
  assert.equal(values.length % 2, 1);
  const g = Tensor.from(values, [values.length], { dtype: "bf16" });
  const bits = new Uint16Array(values.length + 1);
  bits.set(new Uint16Array(await gpu.readBuffer(g.buffer, values.length * 2)));
  bits[values.length] = 0x7f80; // +Inf
  gpu.batch.write(g.buffer, new Uint8Array(bits.buffer));
  const raw = new Uint16Array(await gpu.readBuffer(g.buffer, (values.length + 1) * 2));
  assert.equal(raw[values.length], 0x7f80, "precondition: the padding half holds +inf bits");
  return g;
}

/** A gradient of `values` in `dtype`; f16 and bf16 ones of odd length with a dirty padding half. */
function dirtyGrad(values: number[], dtype: FloatDType): Promise<Tensor> | Tensor {
  if (dtype === "f16") return dirtyOddF16(values);
  if (dtype === "bf16") return dirtyOddBf16(values);
  return Tensor.from(values, [values.length]);
}

/** A per-dtype test's options: f16 is ignored, with the reason in its name, without shader-f16. */
function dtypeTest(name: string, dtype: FloatDType) {
  const ignore = dtype === "f16" && !gpu.f16;
  return {
    name: ignore ? `${name} (ignored: the adapter has no shader-f16)` : name,
    ignore,
    ...GPU_TEST,
  };
}

for (const dtype of DTYPES) {
  Deno.test({
    ...dtypeTest(`GradScaler: detects +Inf, -Inf, NaN in ${dtype} gradients anywhere`, dtype),
    fn: () => detectsNonFinite(dtype),
  });
}

async function detectsNonFinite(dtype: FloatDType) {
  const n = 5001; // several workgroups, odd (f16 / bf16 padding half)
  const scaler = new GradScaler({ lossScale: 2 ** 4 });
  for (const bad of [Infinity, -Infinity, NaN, null]) {
    for (const at of [0, 2500, n - 1]) {
      const values = Array.from({ length: n }, (_, i) => (i % 7) - 3);
      if (bad !== null) values[at] = bad;
      const grad = await dirtyGrad(values, dtype);
      const p = Tensor.zeros([1]);
      p.grad = grad;
      const opt = new FakeOptimizer([p]);
      scaler.step(opt);
      const [flag] = await opt.seenFlags();
      assert.equal(flag, bad === null ? 0 : 1, `${dtype} ${bad} at ${at}`);
      scaler.update();
      assert.equal(await scaler.lastStepSkipped(), bad !== null);
      opt.zeroGrad();
      p.dispose();
    }
  }
  scaler.dispose();
}

Deno.test("GradScaler: overflow from a huge scale is found and backs the scale off", {
  ...GPU_TEST,
}, async () => {
  // loss × 2^127 → backward gives x · 2^127, which overflows f32 for |x| ≥ 2.
  const scaler = new GradScaler({ initScale: 2 ** 127, maxScale: F32_MAX });
  const w = Tensor.from([1, 1], [2], { requiresGrad: true });
  const x = Tensor.from([1, 4], [2]);
  scaler.scale(sum(mul(w, x))).backward();
  const opt = new FakeOptimizer([w]);
  scaler.step(opt);
  assert.deepEqual(await opt.seenFlags(), [1]);
  scaler.update();
  assert.equal(await scaler.getScale(), 2 ** 126);
  scaler.dispose();
  opt.zeroGrad();
});

for (const dtype of DTYPES) {
  // A scale below 1 multiplies on unscale: finite inputs whose product overflows
  // (in bf16 also a product finite in f32 that rounds up past the largest bf16).
  const cases = {
    f32: [[3e38, 0.5]],
    f16: [[60000, 0.5], [2000, 2 ** -6]],
    bf16: [[3e38, 0.5], [BF16_MAX, 0.5], [2 ** 120, 2 ** -10]],
  }[dtype];
  Deno.test({
    ...dtypeTest(`GradScaler: an ${dtype} unscale product that overflows is found`, dtype),
    async fn() {
      for (const [big, scale] of cases) {
        const s = new GradScaler({ lossScale: scale });
        const o = new FakeOptimizer([paramWithGrad([1, big, 2], dtype)]);
        s.step(o);
        assert.deepEqual(await o.seenFlags(), [1], `${dtype} ${big} / ${scale}`);
        const g = await o.params[0].grad!.read();
        const want = [1 / scale, Infinity, 2 / scale];
        assert.deepEqual([...g], [...quantize(want, dtype)], "overflowed values become inf");
        s.dispose();
        o.zeroGrad();
      }
    },
  });
}

const EXACT_CASES = [
  ["f32", 2 ** 16],
  ["f32", 2 ** -3],
  ["f16", 2 ** 4],
  ["bf16", 2 ** 16],
  ["bf16", 2 ** -3],
] as const;
for (const [dtype, scale] of EXACT_CASES) {
  Deno.test({
    ...dtypeTest(`GradScaler: unscale divides ${dtype} exactly by the scale ${scale}`, dtype),
    fn: () => unscaleExactly(dtype, scale),
  });
}

async function unscaleExactly(dtype: FloatDType, scale: number): Promise<void> {
  let seed = 7;
  const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  const n = 3001;
  const raw = Array.from({ length: n }, () => (rand() - 0.5) * 2 ** (rand() * 20 - 4));
  const host = quantize(raw, dtype);
  const scaler = new GradScaler({ lossScale: scale });
  const opt = new FakeOptimizer([paramWithGrad(host, dtype)]);
  scaler.unscale(opt);
  const got = await opt.params[0].grad!.read();
  const want = quantize(host.map((v) => v / scale), dtype);
  for (let i = 0; i < n; i++) {
    assert.ok(Object.is(got[i], want[i]), `${dtype} /${scale} [${i}]: ${got[i]} vs ${want[i]}`);
  }
  scaler.step(opt);
  assert.deepEqual(await opt.seenFlags(), [0]);
  scaler.dispose();
  opt.zeroGrad();
}

Deno.test("GradScaler: misuse and bad options are clear errors", { ...GPU_TEST }, () => {
  const scaler = new GradScaler();
  const opt = new FakeOptimizer([paramWithGrad([1])]);
  scaler.unscale(opt);
  assert.throws(() => scaler.unscale(opt), /unscale\(\) has already been called/);
  scaler.step(opt);
  assert.throws(() => scaler.step(opt), /step\(\) has already been called/);
  assert.throws(() => scaler.unscale(opt), /after step\(\)/);
  scaler.update();
  assert.throws(() => scaler.update(), /no unscale\(\) or step\(\)/);
  for (const bad of [-1, 0, NaN, Infinity]) {
    assert.throws(() => scaler.update(bad), /GradScaler\.update: newScale/);
  }
  assert.throws(
    () => scaler.scale(Tensor.from([1], [1], { dtype: "i32" })),
    /GradScaler\.scale: loss i32/,
  );
  scaler.dispose();
  assert.throws(() => scaler.step(opt), /disposed/);
  opt.zeroGrad();
  const bad: [GradScalerOptions, RegExp][] = [
    [{ initScale: -1 }, /initScale must be a positive/],
    [{ lossScale: 3 }, /lossScale must be 0 \(dynamic\) or a power of two/],
    [{ lossScale: -4 }, /lossScale must be a positive/],
    [{ growthFactor: 1 }, /growthFactor must be a finite number > 1/],
    [{ backoffFactor: 1 }, /backoffFactor must be in \(0, 1\)/],
    [{ backoffFactor: 0 }, /backoffFactor must be in \(0, 1\)/],
    [{ growthInterval: 0 }, /growthInterval must be an integer/],
    [{ growthInterval: 1.5 }, /growthInterval must be an integer/],
    [{ hysteresis: 0 }, /hysteresis must be an integer/],
    [{ minScale: 8, maxScale: 4, initScale: 4 }, /minScale 8 > maxScale 4/],
    [{ initScale: 2 ** 30 }, /initScale 1073741824 is outside \[1, 16777216\]/],
    [{ initScale: 8, lossScale: 16 }, /differ/],
  ];
  for (const [options, message] of bad) {
    assert.throws(() => new GradScaler(options), message, JSON.stringify(options));
  }
  const fixed = new GradScaler({ lossScale: 8 });
  assert.throws(() => fixed.update(4), /static lossScale/);
  fixed.dispose();
});

Deno.test("GradScaler: stateDict round trip continues the same trajectory", {
  ...GPU_TEST,
}, async () => {
  const options = { initScale: 2 ** 10, growthInterval: 3, hysteresis: 2 };
  const opt = new FakeOptimizer([paramWithGrad([1])]);
  const run = async (scaler: GradScaler, steps: string[]) => {
    const seen = [];
    for (const kind of steps) {
      opt.params[0].grad!.dispose();
      opt.params[0].grad = Tensor.from(STEP_GRAD[kind], [3]);
      scaler.step(opt);
      scaler.update();
      seen.push(await scaler.stateDict());
    }
    return seen;
  };
  const a = new GradScaler(options);
  await run(a, ["clean", "clean", "inf"]);
  const saved = JSON.parse(JSON.stringify(await a.stateDict()));
  const rest = ["clean", "inf", "inf", "clean", "clean", "clean", "clean"];
  const expected = await run(a, rest);
  const b = new GradScaler(); // other options: the state brings its own
  b.loadStateDict(saved);
  assert.deepEqual(await run(b, rest), expected);
  assert.equal(await b.skippedSteps(), 3);
  for (
    const [broken, message] of [
      [{ ...saved, scale: -1 }, /scale must be a positive/],
      [{ ...saved, growthTracker: 3 }, /growthTracker 3 must be below/],
      [{ ...saved, hysteresisLeft: 5 }, /hysteresisLeft 5 exceeds/],
      [{ ...saved, skippedSteps: "x" }, /skippedSteps must be an integer/],
      [{ ...saved, options: { ...saved.options, backoffFactor: 2 } }, /backoffFactor/],
      [{ scale: 1 }, /options field/],
    ] as const
  ) {
    assert.throws(() => b.loadStateDict(broken as never), message);
  }
  assert.deepEqual(await b.stateDict(), expected.at(-1), "a failed load changes nothing");
  a.dispose();
  b.dispose();
  opt.zeroGrad();
});

Deno.test("GradScaler: scale(loss) scales the loss and its gradients; no readbacks", {
  ...GPU_TEST,
}, async () => {
  const scaler = new GradScaler({ initScale: 2 ** 12 });
  const xs = [0.5, -3, 7.25];
  const w = Tensor.from([1, 2, 3], [3], { requiresGrad: true });
  const x = Tensor.from(xs, [3]);
  const reads = gpu.batch.counters.reads;
  const loss = sum(mul(w, x));
  const scaled = scaler.scale(loss);
  scaled.backward();
  const opt = new FakeOptimizer([w]);
  scaler.step(opt);
  scaler.update();
  assert.equal(gpu.batch.counters.reads, reads, "scale/backward/step/update never read back");
  assert.deepEqual([...await w.grad!.read()], xs, "unscaled: the true gradient");
  assert.equal(await scaled.item(), (0.5 - 6 + 21.75) * 2 ** 12);
  // Before unscale the gradient is the scaled one.
  w.grad!.dispose(), w.grad = null;
  scaler.scale(sum(mul(w, x))).backward();
  assert.deepEqual([...await w.grad!.read()], xs.map((v) => v * 2 ** 12));
  const off = new GradScaler({ enabled: false });
  assert.equal(off.scale(loss), loss, "disabled: the loss itself");
  off.step(opt);
  off.update();
  assert.equal(opt.signals.at(-1), undefined, "disabled: a plain optimizer.step()");
  assert.equal(await off.getScale(), 1);
  scaler.dispose();
  off.dispose();
  opt.zeroGrad();
});
