import assert from "node:assert/strict";
import { castPolicyOf, customAutocastLists, DEFAULT_AUTOCAST_LISTS } from "../amp/mod.ts";

Deno.test("autocast lists: matmul in f16, reductions and softmax in f32, arithmetic promotes", () => {
  assert.equal(castPolicyOf("matmul"), "f16");
  assert.equal(castPolicyOf("linear"), "f16");
  for (const op of ["softmax", "log_softmax", "sum", "mean", "exp", "log", "cross_entropy"]) {
    assert.equal(castPolicyOf(op), "f32", op);
  }
  assert.equal(castPolicyOf("add"), "promote");
  assert.equal(castPolicyOf("some_new_op"), "promote");
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
