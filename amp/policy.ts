/**
 * The autocast policy as data: which ops run in f16, which must stay f32, and
 * which follow the widest input. Users move ops with custom allow and deny
 * lists, as with Paddle's `AutoMixedPrecisionLists`.
 */

/** Where an op runs under autocast. */
export type CastPolicy = "f16" | "f32" | "promote";

/** The three op lists. */
export interface AutocastLists {
  /** Ops that run in f16 (their inputs are cast down): the matmul family. */
  readonly f16: ReadonlySet<string>;
  /**
   * Ops that must run in f32 (inputs cast up): reductions, exp/log/pow,
   * softmax, losses. LayerNorm and BatchNorm are on no list: they take f16
   * input as it is and keep their statistics (BatchNorm: all its arithmetic)
   * and parameters in f32 inside the kernel.
   */
  readonly f32: ReadonlySet<string>;
  /** Ops that run in the widest dtype among their inputs. */
  readonly promote: ReadonlySet<string>;
}

/** The default lists, following PyTorch's and Paddle's choices. */
export const DEFAULT_AUTOCAST_LISTS: AutocastLists = {
  f16: new Set(["matmul", "linear"]),
  f32: new Set([
    "sum",
    "mean",
    "exp",
    "log",
    "sqrt",
    "square",
    "softmax",
    "log_softmax",
    "cross_entropy",
    "mse_loss",
  ]),
  promote: new Set(["add", "sub", "mul", "div", "relu", "gelu", "neg", "scale", "add_scalar"]),
};

/** Custom lists: `allow` moves ops to f16, `deny` moves them to f32. */
export interface CustomListsOptions {
  /** Ops to run in f16. */
  allow?: readonly string[];
  /** Ops to keep in f32. */
  deny?: readonly string[];
}

/**
 * Lists with ops moved between them. An op named in both `allow` and `deny`
 * is an error, as in Paddle.
 *
 * @example
 * ```ts
 * import { customAutocastLists } from "./policy.ts";
 * const lists = customAutocastLists({ deny: ["matmul"] });
 * console.assert(lists.f32.has("matmul") && !lists.f16.has("matmul"));
 * ```
 */
export function customAutocastLists(
  options: CustomListsOptions = {},
  base: AutocastLists = DEFAULT_AUTOCAST_LISTS,
): AutocastLists {
  const allow = options.allow ?? [], deny = options.deny ?? [];
  const both = allow.filter((op) => deny.includes(op));
  if (both.length > 0) {
    throw new RangeError(
      `customAutocastLists: ${both.join(", ")} cannot be in both allow and deny lists; ` +
        "keep each op in one of them.",
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

/** Where `op` runs under `lists`; ops on no list follow their inputs ("promote"). */
export function castPolicyOf(
  op: string,
  lists: AutocastLists = DEFAULT_AUTOCAST_LISTS,
): CastPolicy {
  if (lists.f16.has(op)) return "f16";
  if (lists.f32.has(op)) return "f32";
  return "promote";
}
