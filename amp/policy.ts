/**
 * The autocast policy as data: which ops run in f16 (or bf16: autocast's
 * dtype), which must stay f32, and which follow the widest input. The defaults come from the op registry
 * (each op's line names its class); users move ops with custom allow and
 * deny lists, as with Paddle's `AutoMixedPrecisionLists`. Every name is
 * checked against the registry: a typo, or an op that never consults
 * autocast, is an error that lists the valid names.
 */
import {
  AUTOCAST_OP_NAMES,
  type AutocastClass,
  type AutocastOpName,
  autocastOpName,
  fail,
  OPS,
  ValueError,
} from "../gpu/mod.ts";

/** Where an op runs under autocast. */
export type CastPolicy = AutocastClass;

/** The three op lists; together they hold every op that consults autocast exactly once. */
export interface AutocastLists {
  /**
   * Ops that run in low precision (their inputs are cast down): the matmul
   * family. In f16, or in bf16 under `autocast(fn, { dtype: "bf16" })`.
   */
  readonly f16: ReadonlySet<AutocastOpName>;
  /**
   * Ops that must run in f32 (inputs cast up): exp/log, reductions, softmax,
   * losses, BatchNorm. LayerNorm follows its input (f16 activations in and
   * out, f32 statistics and fp32 parameters inside the kernel).
   */
  readonly f32: ReadonlySet<AutocastOpName>;
  /** Ops that run in the widest dtype among their float inputs. */
  readonly promote: ReadonlySet<AutocastOpName>;
}

function listOf(cls: AutocastClass): Set<AutocastOpName> {
  return new Set(AUTOCAST_OP_NAMES.filter((op) => OPS[op].autocast === cls));
}

/** The default lists, from the op registry (PyTorch's and Paddle's choices). */
export const DEFAULT_AUTOCAST_LISTS: AutocastLists = {
  f16: listOf("f16"),
  f32: listOf("f32"),
  promote: listOf("promote"),
};

/** Custom lists: `allow` moves ops to f16, `deny` moves them to f32. */
export interface CustomListsOptions {
  /** Ops to run in f16. */
  allow?: readonly AutocastOpName[];
  /** Ops to keep in f32. */
  deny?: readonly AutocastOpName[];
}

/**
 * Lists with ops moved between them. An op named in both `allow` and `deny`
 * is an error, as in Paddle; so is a name that is not a registered op that
 * consults autocast (the message lists the valid names).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { customAutocastLists } from "./policy.ts";
 * const lists = customAutocastLists({ deny: ["matmul", "layer_norm"] });
 * assert.ok(lists.f32.has("matmul"));
 * assert.ok(!lists.f16.has("matmul"));
 * ```
 */
export function customAutocastLists(
  options: CustomListsOptions = {},
  base: AutocastLists = DEFAULT_AUTOCAST_LISTS,
): AutocastLists {
  const where = "customAutocastLists";
  const allow = (options.allow ?? []).map((op) => autocastOpName(op, where));
  const deny = (options.deny ?? []).map((op) => autocastOpName(op, where));
  const both = allow.filter((op) => deny.includes(op));
  if (both.length > 0) {
    fail(
      ValueError,
      where,
      `${both.join(", ")} cannot be in both allow and deny lists; keep each op in one of them.`,
    );
  }
  const f16 = new Set(base.f16), f32 = new Set(base.f32), promote = new Set(base.promote);
  for (const op of allow) {
    f32.delete(op);
    promote.delete(op);
    f16.add(op);
  }
  for (const op of deny) {
    f16.delete(op);
    promote.delete(op);
    f32.add(op);
  }
  return { f16, f32, promote };
}

/** Where `op` runs under `lists`. An unknown name is an error. */
export function castPolicyOf(
  op: AutocastOpName,
  lists: AutocastLists = DEFAULT_AUTOCAST_LISTS,
): CastPolicy {
  return policyIn(lists, autocastOpName(op, "castPolicyOf"));
}

/** Where the (already checked) `op` runs under `lists`: what the cast hook asks for every op. */
export function policyIn(lists: AutocastLists, op: AutocastOpName): CastPolicy {
  if (lists.f16.has(op)) return "f16";
  if (lists.f32.has(op)) return "f32";
  return "promote";
}
