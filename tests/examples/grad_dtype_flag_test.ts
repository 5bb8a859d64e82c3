/**
 * `--grad-dtype f32|f16|bf16` of gpt2.ts and tiny_gpt.ts: parsed (refused
 * without the matching --amp, with --accum above 1, or for another word),
 * and tiny_gpt end to end with AMP, 8-bit AdamW and f16 gradients: it trains
 * as its f32-gradient twin does.
 */
import assert from "node:assert/strict";
import { parseGpt2Args } from "../../examples/gpt2/args.ts";
import { parseTinyGptArgs } from "../../examples/tiny_gpt/args.ts";
import { UsageError } from "../../examples/cli/flags.ts";
import { events, run, TINY_GPT } from "../helpers/examples.ts";
import { GPU_TEST } from "../helpers/gpu.ts";

const GPT2 = ["--random", "124M", "--data", "my.txt"];

Deno.test("--grad-dtype: f32 by default; f16 with --amp, bf16 with --amp bf16; misfits refused", () => {
  const parsers = [parseTinyGptArgs, (a: string[]) => parseGpt2Args([...GPT2, ...a])];
  for (const parse of parsers) {
    assert.equal(parse([])!.gradDtype, "f32");
    assert.equal(parse(["--amp", "--grad-dtype", "f16"])!.gradDtype, "f16");
    assert.equal(parse(["--amp", "bf16", "--grad-dtype=bf16"])!.gradDtype, "bf16");
    const refused = (args: string[], message: string) =>
      assert.throws(
        () => parse(args),
        (e: Error) => e instanceof UsageError && e.message === message,
        args.join(" "),
      );
    refused(["--grad-dtype", "fp16"], '--grad-dtype must be f32, f16 or bf16, not "fp16".');
    refused(
      ["--grad-dtype", "f16"],
      "--grad-dtype f16 needs --amp: gradients are kept in its dtype.",
    );
    refused(
      ["--amp", "--grad-dtype", "bf16"],
      "--grad-dtype bf16 needs --amp bf16: gradients are kept in its dtype.",
    );
  }
  assert.throws(
    () => parseGpt2Args([...GPT2, "--amp", "--accum", "2", "--grad-dtype", "f16"]),
    (e: Error) =>
      e instanceof UsageError &&
      e.message === "--grad-dtype f16 needs --accum 1: gradients accumulated over micro-batches " +
          "are summed in f32; drop --grad-dtype or --accum.",
  );
});

Deno.test({
  name: "tiny_gpt --amp --optim-states 8bit --grad-dtype f16 trains as with f32 gradients",
  ...GPU_TEST,
  async fn() {
    const losses: number[][] = [];
    for (const grads of ["f32", "f16"]) {
      const flags = ["--steps", "20", "--log-every", "10", "--amp", "--optim-states", "8bit"];
      const r = await run(TINY_GPT, [...flags, "--grad-dtype", grads, "--json"], false);
      assert.equal(r.code, 0, r.stderr);
      const steps = events(r.stdout).filter((e) => e.event === "step");
      losses.push(steps.map((e) => e.loss as number));
      const start = events(r.stdout).find((e) => e.event === "start")!;
      assert.equal(start.gradDtype, grads);
    }
    const [f32, f16] = losses;
    assert.equal(f16.length, 2);
    assert.ok(f16[1] < f16[0] && f16[1] < 3.2, `the loss falls: ${f16}`);
    // Same seed, same batches: the runs part only by gradient rounding (2^-11 relative).
    for (let i = 0; i < 2; i++) {
      assert.ok(Math.abs(f16[i] - f32[i]) <= 0.02 * f32[i], `losses ${f16} vs ${f32}`);
    }
  },
});
