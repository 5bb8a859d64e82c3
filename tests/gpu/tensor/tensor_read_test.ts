/**
 * `Tensor.read()` gives each dtype's values exactly: an i32 tensor reads as
 * an `Int32Array` (f32 would round every integer above 2²⁴), f32 and f16 ones
 * as a `Float32Array`.
 */
import assert from "node:assert/strict";
import { Tensor } from "../../../gpu/mod.ts";
import { BatchNorm } from "../../../nn/mod.ts";
import { GPU_TEST } from "../../helpers/gpu.ts";

Deno.test({
  name: "read: i32 values come back exactly as an Int32Array, the extremes and 2^24 + 1 included",
  ...GPU_TEST,
  async fn() {
    const values = [0, -1, 16777217, -16777217, 2147483647, -2147483648, 123456789];
    const t = Tensor.from(values, [values.length], { dtype: "i32" });
    const got = await t.read();
    assert.ok(got instanceof Int32Array, `read() of i32 gave ${got.constructor.name}`);
    assert.deepEqual([...got], values);
    const one = Tensor.from([16777217], [], { dtype: "i32" });
    assert.equal(await one.item(), 16777217);
    const f = Tensor.from([1.5, -2], [2]), h = Tensor.from([0.5, 3], [2], { dtype: "f16" });
    assert.ok((await f.read()) instanceof Float32Array && (await h.read()) instanceof Float32Array);
    for (const x of [t, one, f, h]) x.dispose();
  },
});

Deno.test({
  name: "read: a BatchNorm batch count of 2^24 + 1 (counted on the GPU) reads back exactly",
  ...GPU_TEST,
  async fn() {
    const bn = new BatchNorm(2, { momentum: null });
    // 2^24 batches already seen, as a loaded checkpoint would say.
    bn.numBatchesTracked.writeBytes(new Uint8Array(new Int32Array([2 ** 24]).buffer));
    bn.forward(Tensor.from([1, 2, 3, 4], [2, 2])).dispose();
    const count = await bn.numBatchesTracked.read();
    assert.equal(count[0], 2 ** 24 + 1);
    assert.equal(await bn.numBatchesTracked.item(), 16777217);
    bn.dispose();
  },
});
