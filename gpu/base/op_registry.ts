/**
 * The registry of op names: every op that records a node on the autograd
 * tape or asks the autocast hook how to cast its inputs has exactly one line
 * here, in the spirit of TensorFlow.js's `kernel_names.ts` and PyTorch's
 * `aten::` names. The tape (`record`), the cast hook (`autocastInputs`) and
 * the autocast lists (amp's policy) all take an {@link OpName}, so a typo or
 * a list entry for an op that does not exist is a type error, and at run time
 * a clear one.
 *
 * Each line also says how the op takes part in autocast by default:
 * - `"f16"`: inputs are cast down (the matmul family: products in f16, f32
 *   accumulation inside).
 * - `"f32"`: inputs are cast up (exp/log, reductions, softmax, losses,
 *   BatchNorm: everything whose range or precision f16 cannot hold).
 * - `"promote"`: the op runs in the widest dtype among its float inputs.
 * - `null`: the op never consults autocast, because it moves or wraps values
 *   without computing on them (reshape, permute, cast, checkpoint, the loss
 *   scale): its output dtype is its input's, or the one asked for.
 *
 * The policy is data that amp turns into its default lists; gpu/ itself only
 * hands each op's float inputs to the hook.
 */
import { fail, ValueError } from "./errors.ts";

/** How an op takes part in autocast by default (see the module docs). */
export type AutocastClass = "f16" | "f32" | "promote";

/** One registry line. */
export interface OpInfo {
  /** Its default autocast class; null when the op never consults autocast. */
  readonly autocast: AutocastClass | null;
}

/** Every op, with its default autocast class. Adding an op means adding its line here. */
export const OPS = {
  // Products: f16 multiplies, f32 accumulation inside.
  matmul: { autocast: "f16" },
  linear: { autocast: "f16" },
  conv2d: { autocast: "f16" },
  // Two products around an online softmax: f16 in and out, f32 statistics inside.
  fused_attention: { autocast: "f16" },
  // Elementwise arithmetic follows its widest input.
  add: { autocast: "promote" },
  sub: { autocast: "promote" },
  mul: { autocast: "promote" },
  div: { autocast: "promote" },
  neg: { autocast: "promote" },
  scale: { autocast: "promote" },
  add_scalar: { autocast: "promote" },
  relu: { autocast: "promote" },
  gelu: { autocast: "promote" }, // erf (default) or tanh form, in f32 inside
  // Range-hungry math and reductions: f32.
  exp: { autocast: "f32" },
  log: { autocast: "f32" },
  sqrt: { autocast: "f32" },
  square: { autocast: "f32" },
  sum: { autocast: "f32" },
  mean: { autocast: "f32" },
  max: { autocast: "promote" },
  softmax: { autocast: "f32" },
  log_softmax: { autocast: "f32" },
  // f16 scores stay f16 (half the bytes of the saved T×T probabilities); f32 math inside.
  causal_softmax: { autocast: "promote" },
  cross_entropy: { autocast: "f32" },
  // A head's products in f16 (as linear) around the cross-entropy's f32 math, chunk by chunk.
  linear_cross_entropy: { autocast: "f16" },
  // f16 activations in and out, f32 statistics and fp32 parameters inside.
  layer_norm: { autocast: "promote" },
  // BatchNorm stays fp32: input, parameters, statistics and arithmetic.
  batch_norm: { autocast: "f32" },
  dropout: { autocast: "promote" },
  embedding: { autocast: "promote" },
  // Pooling moves or averages values: f16 in, f16 out (f32 sums inside).
  max_pool2d: { autocast: "promote" },
  avg_pool2d: { autocast: "promote" },
  adaptive_avg_pool2d: { autocast: "promote" },
  // Structural ops: they never consult autocast.
  cast: { autocast: null },
  reshape: { autocast: null },
  permute: { autocast: null },
  narrow: { autocast: null },
  concat: { autocast: null },
  checkpoint: { autocast: null },
  loss_scale: { autocast: null },
} as const satisfies Record<string, OpInfo>;

/** The name of a registered op. */
export type OpName = keyof typeof OPS;

/** The ops that consult autocast (their registry line has a class). */
export type AutocastOpName = {
  [K in OpName]: (typeof OPS)[K]["autocast"] extends null ? never : K;
}[OpName];

/** Every registered op name, in registry order. */
export const OP_NAMES: readonly OpName[] = Object.keys(OPS) as OpName[];

/** The ops that consult autocast, in registry order. */
export const AUTOCAST_OP_NAMES: readonly AutocastOpName[] = OP_NAMES.filter(
  (op) => OPS[op].autocast !== null,
) as AutocastOpName[];

/** True when `name` is a registered op. */
export function isOpName(name: unknown): name is OpName {
  return typeof name === "string" && Object.hasOwn(OPS, name);
}

/**
 * `name` as an op that consults autocast, or a clear error: an unknown name
 * lists the valid ones, a structural op says that autocast never applies to it.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { ValueError } from "./errors.ts";
 * import { autocastOpName } from "./op_registry.ts";
 * assert.equal(autocastOpName("matmul", "customAutocastLists"), "matmul");
 * // The refusal lists the valid names.
 * assert.throws(() => autocastOpName("layer_nrom", "customAutocastLists"), ValueError);
 * assert.throws(() => autocastOpName("layer_nrom", "customAutocastLists"), /layer_norm/);
 * ```
 */
export function autocastOpName(name: unknown, where: string): AutocastOpName {
  if (!isOpName(name)) {
    fail(
      ValueError,
      where,
      `${JSON.stringify(name)} is not an op name. Valid names: ${AUTOCAST_OP_NAMES.join(", ")}.`,
    );
  }
  if (OPS[name].autocast === null) {
    fail(
      ValueError,
      where,
      `'${name}' moves or wraps values and never consults autocast, so it cannot be put on an ` +
        `autocast list. Ops that can: ${AUTOCAST_OP_NAMES.join(", ")}.`,
    );
  }
  return name as AutocastOpName;
}
