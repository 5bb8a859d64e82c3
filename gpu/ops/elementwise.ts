/**
 * Differentiable elementwise ops. Binary ops broadcast their second operand
 * (a bias over rows, a per-row value, a scalar); its gradient is summed back
 * over the repeated axes.
 */
import { record } from "../tensor/autograd.ts";
import { assertDType, type DType } from "../base/dtype.ts";
import { fail, ValueError } from "../base/errors.ts";
import { shortValue } from "../base/short_text.ts";
import {
  type BinaryOp,
  type Broadcast,
  launchBinary,
  launchUnary,
  type UnaryOp,
} from "../kernels/elementwise.ts";
import { launchReduce } from "../kernels/reduce.ts";
import { sameShape } from "../base/shape.ts";
import { Tensor } from "../tensor/tensor.ts";
import { autocastInputs, autocastInputsWidenedInKernel } from "../tensor/autocast_hook.ts";
import type { AutocastOpName } from "../base/op_registry.ts";
import { broadcastInto, isSame, reductionOf } from "./broadcast.ts";
import { assertSameDtype, assertSameGpu, assertTensors } from "./checks.ts";

/** Sums a gradient of the output's shape down to the broadcast operand's shape, times `scale`. */
function reduceToOperand(g: Tensor, operand: Tensor, b: Broadcast, scale = 1): Tensor {
  if (!isSame(b)) {
    return Tensor.adopt(launchReduce("sum", g, reductionOf(g.shape, b), operand.shape, { scale }));
  }
  // Same elements; the operand may still lack leading 1s ([T, C] added to [1, T, C]).
  const scaled = scale === 1 ? g : Tensor.adopt(launchUnary("scale", g, { scalar: scale }));
  if (sameShape(scaled.shape, operand.shape)) return scaled;
  const view = scaled.share(operand.shape);
  if (scaled !== g) scaled.dispose();
  return view;
}

/**
 * Casts the operands as autocast says, checks them, and runs the kernel.
 * A half (f16 or bf16) operand that autocast promotes to f32 (a half
 * residual branch added to the f32 stream) is not cast first: the kernel
 * reads it as it is, which is exact, and writes f32; backward casts that
 * operand's gradient back.
 */
function binary(
  op: BinaryOp & AutocastOpName,
  a0: Tensor,
  b0: Tensor,
): { a: Tensor; b: Tensor; y: Tensor; bc: Broadcast } {
  assertTensors(op, a0, b0);
  const { inputs: [a, b], widened } = autocastInputsWidenedInKernel(op, [a0, b0]);
  assertSameGpu(op, a, b);
  if (!widened) assertSameDtype(op, a, b);
  const bc = broadcastInto(op, a.shape, b.shape);
  return { a, b, y: Tensor.adopt(launchBinary(op, a, b, bc, widened ? "f32" : a.dtype)), bc };
}

/**
 * `g` as the gradient of `x`: itself, or cast to `x`'s dtype when the kernel
 * promoted x (the cast frees `g` unless it is the rule's incoming gradient).
 */
function gradFor(x: Tensor, g: Tensor, upstream: Tensor): Tensor {
  if (g.dtype === x.dtype) return g;
  const cast = Tensor.adopt(launchUnary("identity", g, { out: x.dtype }));
  if (g !== upstream) g.dispose();
  return cast;
}

/**
 * a + b. `b` may be broadcast into `a`'s shape (e.g. a bias of shape [N] added to [M, N]).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { add, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2, 3, 4], [2, 2]); // [M, N]
 * const bias = Tensor.from([10, 20], [2]); // [N]
 * const y = add(x, bias);
 * assert.equal((await y.read()).join(), "11,22,13,24");
 * gpu.destroy();
 * ```
 */
export function add(a0: Tensor, b0: Tensor): Tensor {
  const { a, b, y, bc } = binary("add", a0, b0);
  return record({
    op: "add",
    inputs: [a, b],
    output: y,
    backward: (g, _, needs) => [
      needs[0] ? gradFor(a, g, g) : null,
      needs[1] ? gradFor(b, reduceToOperand(g, b, bc), g) : null,
    ],
  });
}

/** a − b, with `b` broadcast into `a`'s shape. */
export function sub(a0: Tensor, b0: Tensor): Tensor {
  const { a, b, y, bc } = binary("sub", a0, b0);
  return record({
    op: "sub",
    inputs: [a, b],
    output: y,
    backward: (g, _, needs) => [
      needs[0] ? gradFor(a, g, g) : null,
      needs[1] ? gradFor(b, reduceToOperand(g, b, bc, -1), g) : null,
    ],
  });
}

/** a · b elementwise, with `b` broadcast into `a`'s shape. */
export function mul(a0: Tensor, b0: Tensor): Tensor {
  const { a, b, y, bc } = binary("mul", a0, b0);
  return record({
    op: "mul",
    inputs: [a, b],
    output: y,
    save: [a, b],
    backward: (g, [sa, sb], needs) => {
      const ga = needs[0] ? gradFor(sa, Tensor.adopt(launchBinary("mul", g, sb, bc)), g) : null;
      if (!needs[1]) return [ga, null];
      const gab = Tensor.adopt(launchBinary("mul", g, sa));
      const gb = reduceToOperand(gab, sb, bc);
      if (gb !== gab) gab.dispose();
      return [ga, gradFor(sb, gb, g)];
    },
  });
}

/** a / b elementwise, with `b` broadcast into `a`'s shape. */
export function div(a0: Tensor, b0: Tensor): Tensor {
  const { a, b, y, bc } = binary("div", a0, b0);
  // d/da = 1/b; d/db = −a/b² = −y/b.
  return record({
    op: "div",
    inputs: [a, b],
    output: y,
    save: [b, y],
    backward: (g, [sb, sy], needs) => {
      const ga = needs[0] ? gradFor(a, Tensor.adopt(launchBinary("div", g, sb, bc)), g) : null;
      if (!needs[1]) return [ga, null];
      const gy = Tensor.adopt(launchBinary("mul", g, sy));
      const gyb = Tensor.adopt(launchBinary("div", gy, sb, bc));
      gy.dispose();
      const gb = reduceToOperand(gyb, sb, bc, -1);
      if (gb !== gyb) gyb.dispose();
      return [ga, gradFor(sb, gb, g)];
    },
  });
}

/**
 * Backward of a unary op: `saves` names the one tensor the rule needs (the
 * input x, the output y, or nothing), so no other activation is kept alive.
 */
interface UnaryGrad {
  saves: "x" | "y" | "none";
  grad(g: Tensor, saved: Tensor | undefined, s: number): Tensor;
}

/** g·t, then times `factor` when it is not 1. */
function mulScaled(g: Tensor, t: Tensor, op: BinaryOp, factor: number): Tensor {
  const q = Tensor.adopt(launchBinary(op, g, t));
  if (factor === 1) return Tensor.adopt(q);
  const r = Tensor.adopt(launchUnary("scale", q, { scalar: factor }));
  q.dispose();
  return Tensor.adopt(r);
}

const UNARY_GRADS: Record<Exclude<UnaryOp, "identity" | "abs">, UnaryGrad> = {
  neg: { saves: "none", grad: (g) => Tensor.adopt(launchUnary("neg", g)) },
  scale: { saves: "none", grad: (g, _, s) => Tensor.adopt(launchUnary("scale", g, { scalar: s })) },
  add_scalar: { saves: "none", grad: (g) => g },
  exp: { saves: "y", grad: (g, y) => mulScaled(g, y!, "mul", 1) },
  log: { saves: "x", grad: (g, x) => mulScaled(g, x!, "div", 1) },
  sqrt: { saves: "y", grad: (g, y) => mulScaled(g, y!, "div", 0.5) },
  square: { saves: "x", grad: (g, x) => mulScaled(g, x!, "mul", 2) },
  relu: { saves: "x", grad: (g, x) => Tensor.adopt(launchBinary("relu_grad", g, x!)) },
  gelu: { saves: "x", grad: (g, x) => Tensor.adopt(launchBinary("gelu_grad", g, x!)) },
  gelu_erf: { saves: "x", grad: (g, x) => Tensor.adopt(launchBinary("gelu_erf_grad", g, x!)) },
};

type UnaryKernel = keyof typeof UNARY_GRADS;

/**
 * Records one unary op. `kernel` defaults to the op's own name; an op with
 * variants (gelu's exact and tanh forms) names the variant it launches.
 */
function unary(
  op: AutocastOpName,
  x0: Tensor,
  s = 0,
  kernel: UnaryKernel = op as UnaryKernel,
): Tensor {
  assertTensors(op, x0);
  if (typeof s !== "number") {
    fail(ValueError, op, `the scalar must be a number, got ${shortValue(s)} (${typeof s}).`);
  }
  const [x] = autocastInputs(op, [x0]);
  const y = Tensor.adopt(launchUnary(kernel, x, { scalar: s }));
  const { saves, grad } = UNARY_GRADS[kernel];
  const save = saves === "x" ? [x] : saves === "y" ? [y] : [];
  return record({
    op,
    inputs: [x],
    output: y,
    save,
    backward: (g, [saved]) => [grad(g, saved, s)],
  });
}

/** −x. */
export function neg(x: Tensor): Tensor {
  return unary("neg", x);
}
/** x · s for a number s. */
export function scale(x: Tensor, s: number): Tensor {
  return unary("scale", x, s);
}
/** x + s for a number s. */
export function addScalar(x: Tensor, s: number): Tensor {
  return unary("add_scalar", x, s);
}
/** eˣ (f32 math). */
export function exp(x: Tensor): Tensor {
  return unary("exp", x);
}
/** Natural logarithm (f32 math). */
export function log(x: Tensor): Tensor {
  return unary("log", x);
}
/** Square root. */
export function sqrt(x: Tensor): Tensor {
  return unary("sqrt", x);
}
/** x². */
export function square(x: Tensor): Tensor {
  return unary("square", x);
}
/** max(x, 0). */
export function relu(x: Tensor): Tensor {
  return unary("relu", x);
}
/** Options of {@link gelu}. */
export interface GeluOptions {
  /**
   * `"none"` (default, PyTorch's default): the exact 0.5·x·(1 + erf(x/√2));
   * `"tanh"`: the tanh approximation (GPT-2's "gelu_new").
   */
  approximate?: "none" | "tanh";
}

/**
 * GELU with f32 math inside whatever the dtype: exact (erf) by default, or
 * the tanh approximation, as `torch.nn.functional.gelu(x, approximate=...)`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { gelu, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([-1, 0, 1], [3]);
 * const [exact] = await gelu(x).read(); // 0.5·x·(1 + erf(x/√2)) = -0.158655...
 * const [tanh] = await gelu(x, { approximate: "tanh" }).read(); // -0.158808...
 * assert.ok(Math.abs(exact + 0.158655) < 1e-5, `gelu(-1) = ${exact}`);
 * assert.ok(Math.abs(tanh + 0.158808) < 1e-5, `tanh gelu(-1) = ${tanh}`);
 * gpu.destroy();
 * ```
 */
export function gelu(x: Tensor, options: GeluOptions = {}): Tensor {
  const approximate = options.approximate ?? "none";
  if (approximate !== "none" && approximate !== "tanh") {
    fail(
      ValueError,
      "gelu",
      `approximate must be "none" or "tanh", not ${JSON.stringify(approximate)}.`,
    );
  }
  return unary("gelu", x, 0, approximate === "tanh" ? "gelu" : "gelu_erf");
}

/**
 * `x` converted to `dtype` (a copy even when the dtype is unchanged); the
 * gradient casts back. Among f32, f16 and bf16 each value is rounded once,
 * to nearest-even, from its exact value (bf16: NaN becomes 0x7FC0).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { cast, initGpu, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ f16: "off", matmulTiling: "default" });
 * const x = Tensor.from([1 + 2 ** -8, 1 + 3 * 2 ** -8], [2]); // ties of bf16
 * assert.equal((await cast(x, "bf16").read()).join(), [1, 1 + 2 ** -6].join());
 * gpu.destroy();
 * ```
 */
export function cast(x: Tensor, dtype: DType): Tensor {
  assertDType("cast", dtype);
  const y = Tensor.adopt(launchUnary("identity", x, { out: dtype }));
  return record({
    op: "cast",
    inputs: [x],
    output: y,
    backward: (
      g,
    ) => [g.dtype === x.dtype ? g : Tensor.adopt(launchUnary("identity", g, { out: x.dtype }))],
  });
}
