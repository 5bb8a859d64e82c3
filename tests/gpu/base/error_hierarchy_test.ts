/**
 * One error hierarchy: every error the library throws for bad input is a
 * `HalfstepError` subclass whose one-line message names the op and the shapes
 * or values involved, so `catch (e) { if (e instanceof HalfstepError) … }`
 * sees them all: shape mismatches, enormous allocations, bad `initGpu`
 * options, a bad checkpoint spec, a loss that is not a scalar or comes from
 * an empty batch.
 */
import assert from "node:assert/strict";
import {
  add,
  AmpTrainer,
  checkpoint,
  crossEntropy,
  GpuError,
  HalfstepError,
  initGpu,
  Linear,
  linear,
  matmul,
  mean,
  mseLoss,
  ReLU,
  reshape,
  Sequential,
  SGD,
  ShapeError,
  softmax,
  Tensor,
  tidy,
  ValueError,
} from "../../../mod.ts";
import type { AmpTrainerOptions, InitGpuOptions, SegmentSpec } from "../../../mod.ts";
import type { HalfstepErrorClass } from "../../../gpu/mod.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";

/** Asserts `fn` throws `Kind` (a HalfstepError) whose message matches every pattern. */
function assertHalfstepError(
  fn: () => unknown,
  Kind: HalfstepErrorClass,
  ...patterns: RegExp[]
): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof HalfstepError, `not a HalfstepError: ${e}`);
    assert.ok(e instanceof Kind, `${(e as Error).name} is not a ${Kind.name}: ${e}`);
    const { message } = e as Error;
    assert.ok(!message.includes("\n"), `one line: ${message}`);
    for (const p of patterns) assert.match(message, p);
    return true;
  });
}

async function assertRejectsHalfstep(
  promise: Promise<unknown>,
  Kind: HalfstepErrorClass,
  ...patterns: RegExp[]
): Promise<void> {
  await assert.rejects(promise, (e: unknown) => {
    assert.ok(e instanceof Kind, `not a ${Kind.name}: ${e}`);
    for (const p of patterns) assert.match((e as Error).message, p);
    return true;
  });
}

Deno.test({
  name: "errors: shape mismatches in matmul, linear and broadcasting are ShapeErrors",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const a = Tensor.zeros([2, 3]), b = Tensor.zeros([4, 5]);
      assertHalfstepError(() => matmul(a, b), ShapeError, /^matmul:/, /\[2, 3\]/, /\[4, 5\]/);
      assertHalfstepError(
        () => matmul(Tensor.zeros([2, 3]), Tensor.zeros([2, 3, 4])),
        ShapeError,
        /matmul: .*reshape A to \[1, M, K\]/,
      );
      const w = Tensor.zeros([4, 7]);
      assertHalfstepError(() => linear(a, w), ShapeError, /^linear:/, /\[2, 3\]/, /\[4, 7\]/);
      const layer = new Linear(7, 4);
      assertHalfstepError(() => layer.forward(a), ShapeError, /linear/, /\[2, 3\]/, /\[4, 7\]/);
      layer.dispose();
      assertHalfstepError(
        () => add(Tensor.zeros([2, 3]), Tensor.zeros([4])),
        ShapeError,
        /^add: cannot broadcast shape \[4\] to \[2, 3\]/,
      );
    });
  },
});

Deno.test({
  name: "errors: plain-JavaScript misuse (no tensor, no shape array) is a HalfstepError too",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const x = Tensor.zeros([2, 3]);
      const anyOp = add as (a: unknown, b: unknown) => Tensor;
      assertHalfstepError(() => anyOp(x, 3), ValueError, /^add: operand 2 must be a Tensor, got 3/);
      const anyMatmul = matmul as (a: unknown, b: unknown) => Tensor;
      assertHalfstepError(() => anyMatmul([1], x), ValueError, /^matmul: operand 1 must be a/);
      const anyFrom = Tensor.from as (data: unknown, shape: unknown) => Tensor;
      assertHalfstepError(() => anyFrom(null, [2]), ValueError, /^Tensor\.from: data must be/);
      assertHalfstepError(() => anyFrom([1, 2], "2"), ShapeError, /^Tensor\.from: the shape must/);
      const anyLayer = new ReLU().forward as (x: unknown) => Tensor;
      assertHalfstepError(() => anyLayer([1, 2]), ValueError, /^relu: the input must be a Tensor/);
      const loose = { mseLoss, crossEntropy, mean, reshape, softmax } as unknown as Record<
        string,
        (...args: unknown[]) => Tensor
      >;
      assertHalfstepError(() => loose.mseLoss(x, 5), ValueError, /^mseLoss: operand 2 must be/);
      assertHalfstepError(
        () => loose.mseLoss(x, x, { reduction: "avg" }),
        ValueError,
        /^mseLoss: reduction must be "mean", "sum" or "none", not "avg"/,
      );
      assertHalfstepError(
        () => mseLoss(x, Tensor.zeros([3, 2])),
        ShapeError,
        /^mseLoss: cannot broadcast shape \[3, 2\] to \[2, 3\]/,
      );
      assertHalfstepError(() => loose.crossEntropy(x, null), ValueError, /^crossEntropy: targets/);
      assertHalfstepError(() => loose.mean(x, 1), ValueError, /^mean: options must be an object/);
      assertHalfstepError(() => loose.reshape(x, "6"), ShapeError, /^reshape: the shape must be/);
      assertHalfstepError(() => loose.softmax(5), ValueError, /^softmax: the input must be/);
      const AnySequential = Sequential as unknown as new (...layers: unknown[]) => Sequential;
      assertHalfstepError(
        () => new AnySequential(new ReLU(), 5),
        ValueError,
        /^Sequential: layer 1/,
      );
    });
  },
});

Deno.test({
  name: "errors: an enormous tensor is a GpuError naming the op, shape, bytes and limit",
  ...GPU_TEST,
  fn() {
    const { maxBufferSize, maxStorageBufferBindingSize } = gpu.device.limits;
    const [name, limit] = maxBufferSize < maxStorageBufferBindingSize
      ? ["maxBufferSize", maxBufferSize]
      : ["maxStorageBufferBindingSize", maxStorageBufferBindingSize];
    const huge = [1 << 20, 1 << 20]; // 4 TiB of f32: V8 cannot even allocate the host side
    for (
      const [op, make] of [
        ["Tensor.zeros", () => Tensor.zeros(huge)],
        ["Tensor.full", () => Tensor.full(huge, 1)],
        ["Tensor.empty", () => Tensor.empty(huge)],
      ] as const
    ) {
      assertHalfstepError(
        make,
        GpuError,
        new RegExp(`^${op.replace(".", "\\.")}: `),
        /f32 \[1048576, 1048576\]/,
        /4398046511104 bytes/,
        new RegExp(`${name} of ${limit} bytes`),
      );
    }
    // A layer's parameters are checked before their values are drawn on the host.
    assertHalfstepError(() => new Linear(1 << 17, 1 << 17), GpuError, /\[131072, 131072\]/);
    // Past 2^53 elements the byte count itself is not exact: still a clear error.
    assertHalfstepError(() => Tensor.zeros([2 ** 40, 2 ** 40]), GpuError, /Tensor\.zeros/);
    // The device stays usable.
    tidy(() => Tensor.zeros([4]));
  },
});

Deno.test({
  name: "errors: initGpu rejects unknown options and invalid values, listing the valid ones",
  ...GPU_TEST,
  async fn() {
    const bad = (o: Record<string, unknown>) => initGpu(o as InitGpuOptions);
    await assertRejectsHalfstep(
      bad({ matmulTiling: "nonsense" }),
      ValueError,
      /initGpu: matmulTiling/,
      /"tune"/,
      /"default"/,
      /"nonsense"/,
    );
    await assertRejectsHalfstep(
      bad({ matmulTilling: "default" }),
      ValueError,
      /initGpu: unknown option "matmulTilling"/,
      /matmulTiling/,
      /memoryLimitBytes/,
    );
    for (
      const [option, value] of [
        ["debug", "yes"],
        ["setDefault", 1],
        ["powerPreference", "fast"],
        ["memoryLimitBytes", -1],
        ["f16", "on"],
        ["f16Accumulation", "f16"],
        ["flush", "sometimes"],
        ["matmulTiling", { variant: "fast", tm: 4, tn: 4, wgx: 8, wgy: 8, tk: 8 }],
        ["matmulTiling", { variant: "register", tm: 0, tn: 4, wgx: 8, wgy: 8, tk: 8 }],
      ] as const
    ) {
      await assertRejectsHalfstep(
        bad({ [option]: value }),
        ValueError,
        new RegExp(`initGpu: ${option}`),
      );
    }
  },
});

Deno.test({
  name: "errors: Sequential.checkpoint = 'sometimes' is refused, listing what is accepted",
  ...GPU_TEST,
  fn() {
    const model = new Sequential(new Linear(2, 2), new ReLU());
    for (const spec of ["sometimes", 0, 1.5, { budgetBytes: -1 }, { budget: 5 }]) {
      assertHalfstepError(
        () => model.checkpoint = spec as SegmentSpec,
        ValueError,
        /Sequential\.checkpoint/,
        /"auto"/,
        /budgetBytes/,
      );
    }
    assert.equal(model.checkpoint, null, "a refused value is not kept");
    model.checkpoint = "auto";
    model.checkpoint = 2;
    model.checkpoint = { budgetBytes: 1024 };
    model.checkpoint = null;
    model.dispose();
  },
});

Deno.test({
  name: "errors: AmpTrainer.step wants a scalar loss from a non-empty batch",
  ...GPU_TEST,
  async fn() {
    const model = new Sequential(new Linear(3, 2));
    const optimizer = new SGD(model.parameters(), { lr: 0.1, momentum: 0.9 });
    const trainer = new AmpTrainer(model, optimizer);
    const before = await Promise.all(model.parameters().map((p) => p.read()));
    assertHalfstepError(
      () => trainer.step(() => model.forward(Tensor.zeros([4, 3]))),
      ShapeError,
      /AmpTrainer\.step: the loss must be a scalar, got .*\[4, 2\]/,
      /mean\(\) or sum\(\)/,
    );
    assertHalfstepError(
      () => trainer.step(() => crossEntropy(model.forward(Tensor.zeros([0, 3])), [])),
      ValueError,
      /AmpTrainer\.step: the loss comes from an empty batch \(\w+ of f(16|32) \[0(, \d+)?\]\)/,
    );
    assert.equal(trainer.steps, 0, "no step ran");
    const after = await Promise.all(model.parameters().map((p) => p.read()));
    assert.deepEqual(after, before, "the weights are unchanged");
    // The trainer still works.
    trainer.step(() => crossEntropy(model.forward(Tensor.zeros([4, 3])), [0, 1, 0, 1])).dispose();
    assert.equal(trainer.steps, 1);
    model.dispose();
  },
});

Deno.test({
  name: "errors: an AmpTrainer or GradScaler option typo is refused, as initGpu's are",
  ...GPU_TEST,
  fn() {
    const model = new Sequential(new Linear(3, 2));
    const optimizer = new SGD(model.parameters(), { lr: 0.1 });
    // `lossscale` used to be ignored: the run trained with dynamic scaling without a word.
    const typo = { lossscale: 1024 } as unknown as AmpTrainerOptions;
    assertHalfstepError(
      () => new AmpTrainer(model, optimizer, typo),
      ValueError,
      /^AmpTrainer: unknown option lossscale \(known: enabled, dtype, lossScale, /,
    );
    const scaler = { scaler: { growthinterval: 5 } } as unknown as AmpTrainerOptions;
    assertHalfstepError(
      () => new AmpTrainer(model, optimizer, scaler),
      ValueError,
      /^GradScaler\.constructor: unknown option growthinterval \(known: initScale, /,
    );
    model.dispose();
  },
});

Deno.test({
  name: "mseLoss: a target that broadcasts into the input is used, as in PyTorch",
  ...GPU_TEST,
  async fn() {
    const input = Tensor.from([1, 2, 3, 4, 5, 6], [2, 3]);
    const target = Tensor.from([1, 1, 1], [3]);
    const loss = mseLoss(input, target, { reduction: "sum" });
    // (0² + 1² + 2²) + (3² + 4² + 5²) = 55, the sum PyTorch's broadcast gives.
    assert.equal(await loss.item(), 55);
    for (const t of [input, target, loss]) t.dispose();
  },
});

Deno.test({
  name: "errors: checkpoint given a non-function or a non-tensor input is a ValueError",
  ...GPU_TEST,
  fn() {
    const x = Tensor.zeros([2]);
    const anyCheckpoint = checkpoint as unknown as (...args: unknown[]) => Tensor;
    assertHalfstepError(() => anyCheckpoint(5, x), ValueError, /^checkpoint: the first argument/);
    assertHalfstepError(() => anyCheckpoint((t: Tensor) => t, [1]), ValueError, /^checkpoint:/);
    x.dispose();
  },
});
