/**
 * Elementwise kernels: unary maps (with an optional scalar), binary maps with
 * broadcasting of the second operand, and in-place accumulation. Math is f32
 * whatever the storage dtype; the output dtype may differ from the input's,
 * which is how casts are made.
 */
import type { DType } from "../base/dtype.ts";
import type { Gpu } from "../device/gpu.ts";
import { defineKernel, type ElementType } from "../device/kernel.ts";
import type { Shape } from "../base/shape.ts";
import { DeviceArray } from "../device/device_array.ts";
import { activationExpr, WGSL_ERF, WGSL_MATH } from "./wgsl/math.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./wgsl/grid.ts";
import { defineTunerSettings, type TunerSettings } from "../tuning/settings.ts";

const WORKGROUP = 256;
const PER_THREAD = 4;

/** Unary maps of `x` (f32) and the scalar `s`. */
export const UNARY_OPS = {
  identity: "x",
  neg: "-x",
  scale: "x * s",
  add_scalar: "x + s",
  exp: "exp(x)",
  log: "log(x)",
  sqrt: "sqrt(x)",
  abs: "abs(x)",
  square: "x * x",
  relu: activationExpr("relu", "x"),
  gelu: activationExpr("gelu", "x"),
  gelu_erf: "gelu_erf(x)",
} as const;

/** A unary op name. */
export type UnaryOp = keyof typeof UNARY_OPS;

/** Binary maps of `a`, `b` (f32). The `*_grad` ops take (upstream grad, forward input). */
export const BINARY_OPS = {
  add: "a + b",
  sub: "a - b",
  mul: "a * b",
  div: "a / b",
  // PyTorch's threshold_backward: zero where x ≤ 0, so a NaN x passes the gradient.
  relu_grad: "select(0.0, a, b > 0.0 || is_nan(b))",
  gelu_grad: `a * gelu_derivative(b)`,
  gelu_erf_grad: `a * gelu_erf_derivative(b)`,
} as const;

/** A binary op name. */
export type BinaryOp = keyof typeof BINARY_OPS;

/**
 * How a broadcast operand is read. The output is viewed as [outer, mid, inner]
 * and the operand as [outer, 1, inner]: it is repeated along the middle axis.
 * mid = inner = 1 is the plain one-to-one case; a bias over the last axis N of
 * an [M, N] output has mid = M, inner = N; a per-row value has mid = N, inner = 1.
 */
export interface Broadcast {
  /** Times the operand repeats along the middle axis. */
  mid: number;
  /** Elements of the operand's block after the middle axis. */
  inner: number;
}

/** No broadcasting: element i reads element i. */
export const SAME: Broadcast = { mid: 1, inner: 1 };

const BROADCAST_INDEX = `fn source_index(i: u32, mid: u32, inner: u32) -> u32 {
  return (i / (mid * inner)) * inner + i % inner;
}
`;

/**
 * The scalar kernels' loop: each thread stores PER_THREAD consecutive
 * elements of `out`, element `i` being `value(i)` (a WGSL function the
 * kernel defines). A bf16 output is stored a whole word (two elements) at a
 * time: a thread's elements start at a multiple of 4, so no two threads
 * share a word and no atomics are needed.
 */
function loop(out: string, dtype: DType): string {
  const first = `let base = (${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid) * ${PER_THREAD}u;`;
  if (dtype !== "bf16") {
    return `${first}
  for (var k = 0u; k < ${PER_THREAD}u; k++) {
    let i = base + k;
    if (i >= p.n) { return; }
    st_${out}(i, value(i));
  }`;
  }
  return `${first}
  for (var k = 0u; k < ${PER_THREAD}u; k += 2u) {
    let i = base + k;
    if (i >= p.n) { return; }
    var second = 0.0;
    if (i + 1u < p.n) { second = value(i + 1u); }
    st2_${out}(i / 2u, vec2<f32>(value(i), second));
  }`;
}

/**
 * The vec4 form of {@link loop} (operands bound as arrays of vec4, `i` a
 * vec4 index): each thread moves PER_THREAD vec4s, strided by the workgroup
 * so that neighbouring threads touch neighbouring 16 (f32) or 8 (f16, bf16)
 * bytes. `scalars` names each loaded operand's lane as the scalar the
 * expression `expr` reads (`{ x: "src" }`: x = lane of ld4_src(i)); the
 * result goes to the same lane of `out`.
 */
function loop4(scalars: Readonly<Record<string, string>>, out: string, expr: string): string {
  const operands = [...new Set(Object.values(scalars))];
  const loads = operands.map((name) => `let ${name}4 = ld4_${name}(i);`).join(" ");
  const lanes = [0, 1, 2, 3].map((c) => {
    const lets = Object.entries(scalars).map(([x, name]) => `let ${x} = ${name}4[${c}];`);
    return `{ ${lets.join(" ")} r[${c}] = ${expr}; }`;
  });
  return `let base = ${WGSL_WORKGROUP_INDEX} * ${WORKGROUP * PER_THREAD}u + lid;
  for (var k = 0u; k < ${PER_THREAD}u; k++) {
    let i = base + k * ${WORKGROUP}u;
    if (i >= p.n / 4u) { return; }
    ${loads}
    var r: vec4<f32>;
    ${lanes.join("\n    ")}
    st4_${out}(i, r);
  }`;
}

/** The elementwise kernels' tuning settings on one device (see {@link elementwiseSettings}). */
export interface ElementwiseSettings {
  /** Move vec4s when the operands allow it (no broadcast, a multiple of 4 elements); false: scalar kernels. */
  vec4: boolean;
}

/**
 * The elementwise kernels' settings of a device (`elementwiseSettings.of(gpu).vec4`).
 * Default on: on GPUs wide coalesced loads are how bandwidth is reached, and
 * on lavapipe the vec4 kernels beat the scalar ones too. Tests switch it off
 * to compare the two.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, elementwiseSettings } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * assert.ok(elementwiseSettings.of(gpu).vec4);
 * gpu.destroy();
 * ```
 */
export const elementwiseSettings: TunerSettings<ElementwiseSettings> = defineTunerSettings(
  "elementwise",
  () => ({ vec4: true }),
);

/** A binding's element type: the dtype, or vec4 of it in the vec4 kernels. */
function element(dtype: DType, vec4: boolean): ElementType {
  return vec4 ? `vec4<${dtype as "f32" | "f16" | "bf16"}>` : dtype;
}

/**
 * Whether an op over `n` elements of these dtypes may use the vec4 kernels:
 * one-to-one operands (no broadcast), n a multiple of 4, float storage (bf16
 * included: a vec4 of it is two whole words), and an adapter where vec4 pays
 * ({@link elementwiseSettings}).
 */
function useVec4(gpu: Gpu, n: number, dtypes: readonly DType[], broadcast: Broadcast): boolean {
  return elementwiseSettings.of(gpu).vec4 && n % 4 === 0 && broadcast.mid === 1 &&
    broadcast.inner === 1 &&
    dtypes.every((d) => d !== "i32");
}

export const unaryKernel = defineKernel({
  name: "unary",
  bindings: (c: { op: UnaryOp; dtype: DType; out: DType; vec4: boolean }) => [
    { name: "src", type: element(c.dtype, c.vec4) },
    { name: "dst", type: element(c.out, c.vec4), write: true },
  ],
  uniforms: { n: "u32", s: "f32", mid: "u32", inner: "u32" },
  source: ({ op, out, vec4 }) =>
    `${WGSL_MATH}${op === "gelu_erf" ? WGSL_ERF : ""}${BROADCAST_INDEX}
${
      vec4 ? "" : `fn value(i: u32) -> f32 {
  let s = p.s;
  let x = ld_src(source_index(i, p.mid, p.inner));
  return ${UNARY_OPS[op]};
}`
    }
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let s = p.s;
  ${vec4 ? loop4({ x: "src" }, "dst", UNARY_OPS[op]) : loop("dst", out)}
}`,
});

export const binaryKernel = defineKernel({
  name: "binary",
  bindings: (c: { op: BinaryOp; a: DType; b: DType; out: DType; vec4: boolean }) => [
    { name: "lhs", type: element(c.a, c.vec4) },
    { name: "rhs", type: element(c.b, c.vec4) },
    { name: "dst", type: element(c.out, c.vec4), write: true },
  ],
  uniforms: { n: "u32", mid: "u32", inner: "u32" },
  source: ({ op, out, vec4 }) =>
    `${WGSL_MATH}${op === "gelu_erf_grad" ? WGSL_ERF : ""}${BROADCAST_INDEX}
${
      vec4 ? "" : `fn value(i: u32) -> f32 {
  let a = ld_lhs(i);
  let b = ld_rhs(source_index(i, p.mid, p.inner));
  return ${BINARY_OPS[op]};
}`
    }
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${vec4 ? loop4({ a: "lhs", b: "rhs" }, "dst", BINARY_OPS[op]) : loop("dst", out)}
}`,
});

export const accumulateKernel = defineKernel({
  name: "accumulate",
  bindings: (c: { dst: DType; src: DType; vec4: boolean }) => [
    { name: "acc", type: element(c.dst, c.vec4), write: true },
    { name: "add", type: element(c.src, c.vec4) },
  ],
  uniforms: { n: "u32", alpha: "f32", beta: "f32" },
  source: ({ dst, vec4 }) =>
    `${vec4 ? "" : "fn value(i: u32) -> f32 { return p.beta * ld_acc(i) + p.alpha * ld_add(i); }"}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  ${vec4 ? loop4({ x: "acc", y: "add" }, "acc", "p.beta * x + p.alpha * y") : loop("acc", dst)}
}`,
});

/** Workgroups for n elements, 4 to a vec4 in the vec4 kernels. */
function workgroupsFor(n: number, vec4 = false): [number, number] {
  return grid1d(Math.ceil(n / (WORKGROUP * PER_THREAD * (vec4 ? 4 : 1))));
}

/** Options of {@link launchUnary}. */
export interface UnaryOptions {
  /** The scalar `s` of ops that take one (scale, add_scalar). */
  scalar?: number;
  /** Output dtype (default: the input's); a different one makes a cast. */
  out?: DType;
  /** Output shape and how `src` is broadcast into it (default: same as `src`). */
  expand?: { shape: Shape; broadcast: Broadcast };
}

/** dst = op(src, s) elementwise as a new tensor (no autograd). */
export function launchUnary(
  op: UnaryOp,
  src: DeviceArray,
  options: UnaryOptions = {},
): DeviceArray {
  const out = options.out ?? src.dtype;
  const { shape, broadcast } = options.expand ?? { shape: src.shape, broadcast: SAME };
  const dst = DeviceArray.empty(shape, out, src.gpu);
  const n = dst.size;
  if (n === 0) return dst;
  const vec4 = useVec4(src.gpu, n, [src.dtype, out], broadcast);
  const kernel = src.gpu.kernel(unaryKernel, { op, dtype: src.dtype, out, vec4 });
  const uniforms = { n, s: options.scalar ?? 0, mid: broadcast.mid, inner: broadcast.inner };
  src.gpu.dispatch(kernel, { src, dst }, uniforms, workgroupsFor(n, vec4));
  return dst;
}

/** dst = op(a, b) elementwise with the shape of `a`; `b` is broadcast as described (no autograd). */
export function launchBinary(
  op: BinaryOp,
  a: DeviceArray,
  b: DeviceArray,
  broadcast: Broadcast = SAME,
  out: DType = a.dtype,
): DeviceArray {
  const dst = DeviceArray.empty(a.shape, out, a.gpu);
  const n = a.size;
  if (n === 0) return dst;
  const vec4 = useVec4(a.gpu, n, [a.dtype, b.dtype, out], broadcast);
  const kernel = a.gpu.kernel(binaryKernel, { op, a: a.dtype, b: b.dtype, out, vec4 });
  a.gpu.dispatch(
    kernel,
    { lhs: a, rhs: b, dst },
    { n, mid: broadcast.mid, inner: broadcast.inner },
    workgroupsFor(n, vec4),
  );
  return dst;
}

/** dst = beta · dst + alpha · src in place (same size; dtypes may differ, math in f32). No autograd. */
export function launchAccumulateInto(
  dst: DeviceArray,
  src: DeviceArray,
  alpha = 1,
  beta = 1,
): void {
  const n = dst.size;
  if (n === 0) return;
  const vec4 = useVec4(dst.gpu, n, [dst.dtype, src.dtype], SAME);
  const kernel = dst.gpu.kernel(accumulateKernel, { dst: dst.dtype, src: src.dtype, vec4 });
  dst.gpu.dispatch(kernel, { acc: dst, add: src }, { n, alpha, beta }, workgroupsFor(n, vec4));
}

/** A copy of `t` in a new buffer, in stream order (no autograd). */
export function launchCopy(t: DeviceArray): DeviceArray {
  const dst = DeviceArray.empty(t.shape, t.dtype, t.gpu);
  t.gpu.batch.copy(t.buffer, dst.buffer, Math.min(t.buffer.size, dst.buffer.size));
  return dst;
}
