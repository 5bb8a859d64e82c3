/**
 * The op registry is complete: every op that consults autocast asks the cast
 * hook under its registered name (driven one by one under a recording hook),
 * structural ops never ask, and every op the tape records carries a
 * registered name. Custom lists reach the ops they name.
 */
import assert from "node:assert/strict";
import {
  adaptiveAvgPool2d,
  add,
  addScalar,
  autocast,
  avgPool2d,
  batchNorm,
  causalSoftmax,
  checkpoint,
  concat,
  conv2d,
  crossEntropy,
  customAutocastLists,
  div,
  dropout,
  embedding,
  exp,
  fusedCausalAttention,
  gelu,
  GradScaler,
  layerNorm,
  linear,
  linearCrossEntropy,
  log,
  logSoftmax,
  matmul,
  max,
  maxPool2d,
  mean,
  mul,
  narrow,
  neg,
  noGrad,
  permute,
  RandomGenerator,
  relu,
  reshape,
  scale,
  softmax,
  sqrt,
  square,
  sub,
  sum,
  Tensor,
  tidy,
} from "../../../mod.ts";
import {
  AUTOCAST_OP_NAMES,
  type AutocastOpName,
  cast,
  type CastHook,
  isOpName,
  OP_NAMES,
  type OpName,
  withState,
} from "../../../gpu/mod.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";

const x = Tensor.from([0.5, 1, 1.5, 2, 2.5, 3], [2, 3], { requiresGrad: true });
const w = Tensor.from([1, 0, 0, 0, 1, 0], [2, 3], { requiresGrad: true });
const square2 = Tensor.from([1, 2, 3, 4], [2, 2]);
const sequence = reshape(x, [1, 2, 3]); // [batch, T, features]
const ids = Tensor.from([1, 0], [2], { dtype: "i32" });
const image = Tensor.from([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 1, 3, 3], { requiresGrad: true });
const kernel = Tensor.from([1, 0, 0, 1], [1, 1, 2, 2], { requiresGrad: true });
const stats = () => ({ runningMean: Tensor.zeros([3]), runningVar: Tensor.full([3], 1) });

/** One call of each op that consults autocast; the type makes the table complete. */
const DRIVERS: Record<AutocastOpName, () => unknown> = {
  matmul: () => matmul(x, w, { transB: true }),
  linear: () => linear(x, w),
  add: () => add(x, x),
  sub: () => sub(x, x),
  mul: () => mul(x, x),
  div: () => div(x, x),
  neg: () => neg(x),
  scale: () => scale(x, 2),
  add_scalar: () => addScalar(x, 1),
  relu: () => relu(x),
  gelu: () => gelu(x),
  exp: () => exp(x),
  log: () => log(x),
  sqrt: () => sqrt(x),
  square: () => square(x),
  sum: () => sum(x),
  mean: () => mean(x),
  max: () => noGrad(() => max(x)),
  softmax: () => softmax(x),
  log_softmax: () => logSoftmax(x),
  causal_softmax: () => causalSoftmax(square2),
  cross_entropy: () => crossEntropy(x, [2, 0]),
  linear_cross_entropy: () => linearCrossEntropy(x, w, [1, 0]),
  layer_norm: () => layerNorm(x),
  batch_norm: () => batchNorm(x, { ...stats(), training: true }),
  dropout: () => dropout(x, 0.5, new RandomGenerator(1).take(x.size)),
  embedding: () => embedding(x, ids),
  conv2d: () => conv2d(image, kernel),
  fused_attention: () => fusedCausalAttention(sequence, sequence, sequence, { heads: 1 }),
  max_pool2d: () => maxPool2d(image, { kernelSize: 2 }),
  avg_pool2d: () => avgPool2d(image, { kernelSize: 2 }),
  adaptive_avg_pool2d: () => adaptiveAvgPool2d(image, 1),
};

/** Runs `fn` under a hook that records the op names it is asked about (casting nothing). */
function askedBy(fn: () => unknown): OpName[] {
  const asked: OpName[] = [];
  const hook: CastHook = (op, inputs) => {
    asked.push(op);
    return [...inputs];
  };
  tidy(() => withState({ castHook: hook }, fn));
  return asked;
}

Deno.test({
  name: "op registry: every op that consults autocast asks the hook under its own name",
  ...GPU_TEST,
  fn() {
    assert.deepEqual(Object.keys(DRIVERS).sort(), [...AUTOCAST_OP_NAMES].sort());
    for (const op of AUTOCAST_OP_NAMES) {
      const asked = askedBy(DRIVERS[op]);
      assert.ok(asked.includes(op), `${op} did not ask the cast hook (asked: ${asked})`);
      for (const name of asked) assert.ok(AUTOCAST_OP_NAMES.includes(name as AutocastOpName));
    }
  },
});

Deno.test({
  name: "op registry: structural ops never ask the hook; every recorded node has a registered name",
  ...GPU_TEST,
  fn() {
    const scaler = new GradScaler();
    const structural: Record<Exclude<OpName, AutocastOpName>, () => Tensor> = {
      cast: () => cast(x, "f32"),
      reshape: () => reshape(x, [3, 2]),
      permute: () => permute(x, [1, 0]),
      narrow: () => narrow(x, 1, 1, 2),
      concat: () => concat([x, x], 0),
      checkpoint: () => checkpoint((t) => reshape(t, [6]), x),
      loss_scale: () => scaler.scale(sum(x)),
    };
    for (const [op, make] of Object.entries(structural)) {
      const asked = askedBy(() => {
        const y = make();
        assert.equal(y.gradFn?.op, op, `${op} is recorded under its registry name`);
      });
      const own = asked.filter((name) => name !== "sum"); // loss_scale's input
      assert.deepEqual(own, [], `${op} asked the hook`);
    }
    for (const op of AUTOCAST_OP_NAMES) {
      tidy(() => {
        const y = DRIVERS[op]();
        if (y instanceof Tensor && y.gradFn) assert.ok(isOpName(y.gradFn.op), y.gradFn.op);
      });
    }
    assert.equal(new Set(OP_NAMES).size, OP_NAMES.length);
    scaler.dispose();
  },
});

Deno.test({
  name: "op registry: custom lists reach LayerNorm, BatchNorm and embedding under autocast",
  ignore: !gpu.f16,
  ...GPU_TEST,
  fn() {
    const h = Tensor.from([1, 2, 3, 4, 5, 6], [2, 3], { dtype: "f16" });
    tidy(() => {
      // Defaults: LayerNorm keeps f16 activations; BatchNorm is fp32 (f16 input cast up).
      autocast(() => {
        assert.equal(layerNorm(h).dtype, "f16");
        assert.equal(batchNorm(h, { ...stats(), training: true }).dtype, "f32");
        assert.equal(embedding(x, ids).dtype, "f32");
      });
      const lists = customAutocastLists({ deny: ["layer_norm"], allow: ["embedding"] });
      autocast(() => {
        assert.equal(layerNorm(h).dtype, "f32", "deny layer_norm: its input is cast up");
        assert.equal(embedding(x, ids).dtype, "f16", "allow embedding: the table is cast down");
      }, { lists });
    });
  },
});
