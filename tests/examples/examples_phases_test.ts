/**
 * No silent phase when output is piped (issue 47, 7): the CNN printed
 * nothing for about 2 minutes before its first 50 steps (the first step
 * compiles its kernels), GPT-2 nothing between "text: …" and its first
 * validation line, and sampling nothing for 18 s before any text. Piped
 * (no progress bar), each phase now starts with a line: the first step
 * before it is recorded and after, evaluation, validation, sampling.
 *
 * Default pass only (.ci/run leaves it out of the Dawn pass): it runs the
 * examples as a user does, in subprocesses, whose kernels the Dawn pass
 * tests in process (and the examples on Dawn: dawn_backend_test.ts).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { GPT2, MNIST, run, TINY_GPT, withTempDir } from "../helpers/examples.ts";
import { checkpoint, TEXT } from "../helpers/gpt2_twin.ts";
import { GPU_TEST } from "../helpers/gpu.ts";

/** Asserts that `stdout` has a line matching each of `lines`, in that order. */
function assertInOrder(stdout: string, lines: RegExp[], what: string): void {
  const all = stdout.split("\n");
  let at = -1;
  for (const line of lines) {
    const found = all.findIndex((l, i) => i > at && line.test(l));
    assert.ok(found > at, `${what}: no ${line} after line ${at + 1} in:\n${stdout}`);
    at = found;
  }
}

Deno.test({
  name: "examples piped: the CNN's first step, its evaluation, GPT-2's validation and sampling " +
    "and tiny_gpt's phases each start with a line",
  ...GPU_TEST,
  async fn() {
    const cnn = await run(MNIST, ["--model", "cnn", "--limit", "256", "--epochs", "1"]);
    assert.equal(cnn.code, 0, cnn.stderr);
    assertInOrder(cnn.stdout, [
      /^CNN /,
      /^first step: compiling its kernels/,
      /^first step recorded in [\d.]+ s; training \(a line every 50 steps\)$/,
      /^epoch 1 step +\d+\/2 /,
      /^epoch 1: evaluating 10000 test images\.\.\.$/,
      /^epoch 1: test accuracy/,
    ], "mnist --model cnn");
    await withTempDir(async (dir) => {
      const weights = await checkpoint(dir), data = join(dir, "text.txt");
      await Deno.writeTextFile(data, TEXT);
      const gpt2 = await run(GPT2, [
        ...["--weights", weights, "--data", data, "--context", "16", "--batch", "2"],
        ...["--steps", "2", "--eval-windows", "2", "--prompt", "The cat", "--max-new-tokens", "3"],
      ]);
      assert.equal(gpt2.code, 0, gpt2.stderr);
      assertInOrder(gpt2.stdout, [
        /^text: /,
        /^validating: 2 held-out windows of 16 tokens\.\.\.$/,
        /^validation loss before training: /,
        /^first step: compiling its kernels/,
        /^first step recorded in/,
        /^step 2\/2 /,
        /^sampling 3 tokens after the prompt's 2 \(the first compiles the kernels\)\.\.\.$/,
        /^The cat/,
      ], "gpt2");
    });
    const tiny = await run(TINY_GPT, ["--steps", "4", "--log-every", "2", "--eval-windows", "8"]);
    assert.equal(tiny.code, 0, tiny.stderr);
    assertInOrder(tiny.stdout, [
      /^first step: compiling its kernels/,
      /^first step recorded in/,
      /^step +2\/4 /,
      /^evaluating: 8 validation windows/,
      /^sampling 8 words\.\.\.$/,
    ], "tiny_gpt");
  },
});
