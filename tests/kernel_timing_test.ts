import assert from "node:assert/strict";
import { timeCandidates } from "../gpu/kernel_timing.ts";

Deno.test("tuners: the finalists are timed again and keep their better time", async () => {
  // First round: c looks fastest only because a noisy spike slowed b down.
  const rounds: Record<string, number[]> = { a: [4], b: [2.5, 1], c: [2, 2.2], d: [3, 3], e: [9] };
  const calls: string[] = [];
  const { best, seconds } = await timeCandidates(["a", "b", "c", "d", "e"], (name) => {
    calls.push(name);
    return Promise.resolve(rounds[name].shift()!);
  });
  assert.equal(best, "b");
  assert.deepEqual(seconds, [4, 1, 2, 3, 9]);
  // Every candidate once, then the three fastest again, slowest of them first.
  assert.deepEqual(calls, ["a", "b", "c", "d", "e", "d", "b", "c"]);
});
