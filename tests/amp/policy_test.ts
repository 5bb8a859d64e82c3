import assert from "node:assert/strict";
import { castPolicyOf } from "../../amp/mod.ts";
import { customAutocastLists, DEFAULT_AUTOCAST_LISTS, ValueError } from "../../mod.ts";
import { AUTOCAST_OP_NAMES, type AutocastOpName, OPS } from "../../gpu/mod.ts";

Deno.test("autocast lists: matmul in f16, reductions and softmax in f32, arithmetic promotes", () => {
  assert.equal(castPolicyOf("matmul"), "f16");
  assert.equal(castPolicyOf("linear"), "f16");
  const f32 = [
    "softmax",
    "log_softmax",
    "sum",
    "mean",
    "exp",
    "log",
    "cross_entropy",
    "batch_norm",
  ] as const;
  for (const op of f32) assert.equal(castPolicyOf(op), "f32", op);
  assert.equal(castPolicyOf("add"), "promote");
  assert.equal(castPolicyOf("layer_norm"), "promote", "f16 activations, f32 statistics inside");
});

Deno.test("autocast lists: the defaults are the registry's classes, each op on exactly one list", () => {
  const { f16, f32, promote } = DEFAULT_AUTOCAST_LISTS;
  assert.equal(f16.size + f32.size + promote.size, AUTOCAST_OP_NAMES.length);
  for (const op of AUTOCAST_OP_NAMES) {
    const on = [f16, f32, promote].filter((list) => list.has(op));
    assert.equal(on.length, 1, `${op} is on ${on.length} lists`);
    assert.equal(castPolicyOf(op), OPS[op].autocast, op);
  }
});

Deno.test("autocast lists: allow and deny move ops; an op in both is an error", () => {
  const lists = customAutocastLists({ allow: ["softmax"], deny: ["matmul"] });
  assert.equal(castPolicyOf("softmax", lists), "f16");
  assert.equal(castPolicyOf("matmul", lists), "f32");
  assert.equal(castPolicyOf("matmul"), "f16", "defaults are not mutated");
  assert.ok(DEFAULT_AUTOCAST_LISTS.f32.has("softmax"));
  assert.throws(
    () => customAutocastLists({ allow: ["gelu", "exp"], deny: ["exp"] }),
    /exp cannot be in both allow and deny lists/,
  );
});

Deno.test("autocast lists: an unknown or structural op name is an error that lists the valid names", () => {
  // From plain JavaScript (or with a cast) a typo must not pass silently.
  const typo = "layer_nrom" as AutocastOpName;
  assert.throws(
    () => customAutocastLists({ deny: [typo] }),
    (e: Error) =>
      e instanceof ValueError &&
      /customAutocastLists: "layer_nrom" is not an op name\. Valid names: .*layer_norm/.test(
        e.message,
      ),
  );
  assert.throws(() => castPolicyOf("some_new_op" as AutocastOpName), /is not an op name/);
  assert.throws(
    () => customAutocastLists({ allow: ["reshape" as AutocastOpName] }),
    /'reshape' moves or wraps values and never consults autocast/,
  );
});
