/**
 * examples/gpt2.ts as a user runs it, on a GPT-2-shaped checkpoint the torch
 * twin writes (vocabulary 50257, 2 layers, width 32): fine-tuning lowers the
 * validation loss, saves the run and Hugging Face's file, samples greedy ids
 * that the library gives again from the saved file; a resumed run goes on
 * from its step, other flags are refused, a file that is not GPT-2's is one
 * line; a run saved at step 3 and resumed is the uninterrupted run bit for
 * bit; the other examples' guarantees (refusals before start-up, --save
 * over a run, divergence before saving); and tiny_gpt.ts --data trains on a
 * given text and samples from it.
 * Needs a python3 with torch for the checkpoint (CI installs it).
 *
 * Default pass only (.ci/run leaves it out of the Dawn pass): it runs the
 * examples as a user does, in subprocesses, whose kernels the Dawn pass
 * tests in process (and the examples on Dawn: dawn_backend_test.ts).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  assertRefused,
  BACKEND_PERMISSIONS,
  errorLines,
  events,
  GPT2,
  type Run,
  run,
  TINY_GPT,
  withTempDir,
} from "../helpers/examples.ts";
import { AdamW, AmpTrainer } from "../../mod.ts";
import { loadSafetensors, saveTrainingState } from "../../files.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { checkpoint, TEXT } from "../helpers/gpt2_twin.ts";
import { loadGpt2 } from "../../models/mod.ts";
import { generate } from "../../models/mod.ts";
import { encodeGpt2 } from "../../models/mod.ts";

Deno.test({
  name: "gpt2.ts: fine-tunes a GPT-2 checkpoint on a text (validation loss falls), saves the run " +
    "and Hugging Face's file, samples greedy ids the saved file gives again, resumes from its " +
    "step, refuses other flags and a file that is not GPT-2's",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const weights = await checkpoint(dir), data = join(dir, "text.txt");
      await Deno.writeTextFile(data, TEXT);
      const saved = join(dir, "run.safetensors"), out = join(dir, "out.safetensors");
      const flags = [
        ...["--weights", weights, "--data", data, "--context", "16", "--batch", "4"],
        ...["--lr", "3e-3", "--warmup", "1", "--eval-every", "3", "--eval-windows", "4"],
        ...["--save", saved, "--json"],
      ];
      const sample = ["--prompt", "The cat", "--max-new-tokens", "6", "--temperature", "0"];
      const first = await run(GPT2, [...flags, "--steps", "6", "--save-weights", out, ...sample]);
      assert.equal(first.code, 0, first.stderr);
      const evs = events(first.stdout);
      const losses = evs.filter((e) => e.event === "eval").map((e) => e.validationLoss as number);
      assert.equal(losses.length, 3, "before training, at step 3 and at step 6");
      assert.ok(losses[2] < losses[0] - 0.5, `validation loss ${losses.join(" → ")}`);
      assert.deepEqual(evs.filter((e) => e.event === "save").map((e) => e.step), [3, 6]);
      const ids = evs.find((e) => e.event === "sample")!.ids as number[];
      assert.equal(ids.length, 6);
      const { model } = await loadGpt2(out);
      const [again] = await generate(model, [encodeGpt2("The cat")], {
        maxNewTokens: 6,
        temperature: 0,
      });
      assert.deepEqual(again, ids, "the saved file samples the same greedy ids");
      model.dispose();
      // Other flags are refused with one line (an extended run: tests/examples/gpt2_extend_test.ts).
      const again2 = await run(GPT2, [...flags, "--steps", "6", "--resume", saved, "--lr", "1e-3"]);
      assert.equal(again2.code, 2, "another --lr without --override: refused");
      assert.deepEqual(errorLines(again2).length, 1, again2.stderr);
      assert.match(again2.stderr, /would change --lr 0\.001 \(saved: 0\.003\); give the saved/);
      const finished = await run(GPT2, [...flags, "--steps", "6", "--resume", saved]);
      assert.equal(finished.code, 0, finished.stderr);
      assert.ok(events(finished.stdout).some((e) => e.event === "resume" && e.step === 6));
      const foreign = join(dir, "text.safetensors");
      await Deno.copyFile(join(dir, "run.safetensors"), foreign);
      const wrong = await run(GPT2, ["--weights", foreign, "--prompt", "Hi"]);
      assertRefused(wrong, /not a GPT-2 checkpoint|not names? of GPT-2/, "a training-state file");
    });
  },
});

const exists = (path: string) => Deno.stat(path).then(() => true, () => false);

/** Asserts a refusal before start-up: exit status `code`, one line matching `message`, no output. */
function assertRefusedWith(r: Run, code: number, message: RegExp, what: string): void {
  assert.equal(r.code, code, `${what}: exit status (stderr: ${r.stderr})`);
  const lines = errorLines(r);
  assert.equal(lines.length, 1, `${what}: one line, no stack trace: ${JSON.stringify(lines)}`);
  assert.match(lines[0], message, what);
  assert.equal(r.stdout.trim(), "", `${what}: refused before start-up (no start event)`);
}

Deno.test({
  name: "gpt2.ts keeps the other examples' guarantees: a --resume file it cannot continue or " +
    "cannot find and a prompt longer than the model's context are refused in one line before " +
    "start-up; --save over a saved run needs --resume or --overwrite; a run whose validation " +
    "loss is NaN stops with exit status 3 and the good file untouched; no lock is left",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const weights = await checkpoint(dir), data = join(dir, "text.txt");
      await Deno.writeTextFile(data, TEXT);
      const path = join(dir, "run.safetensors");
      const flags = [
        ...["--weights", weights, "--data", data, "--context", "16", "--batch", "2"],
        ...["--steps", "1", "--eval-windows", "1", "--save", path, "--json"],
      ];
      // saveTrainingState without gpt2.ts's record: it used to crash with a TypeError.
      const { model } = await loadGpt2(weights), optimizer = new AdamW(model.parameters());
      const trainer = new AmpTrainer(model, optimizer, { enabled: false });
      const partial = join(dir, "partial.safetensors");
      await saveTrainingState(partial, { model, optimizer, trainer });
      trainer.dispose();
      model.dispose();
      const foreign = await run(GPT2, [...flags, "--resume", partial, "--save", partial]);
      assertRefusedWith(
        foreign,
        1,
        /^gpt2: cannot resume: --resume .*partial\.safetensors: a training state without gpt2\.ts's record of the run/,
        "a training state without the record",
      );
      assert.ok(!(await exists(`${partial}.lock`)), "no lock left behind");
      assertRefusedWith(
        await run(GPT2, [...flags, "--resume", join(dir, "missing.safetensors")]),
        1,
        /^gpt2: cannot resume: --resume .*missing\.safetensors: no such file$/,
        "a missing --resume file",
      );
      const prompt = "The cat sat on the mat ".repeat(6); // 37 tokens: over the 32 positions
      assertRefusedWith(
        await run(GPT2, ["--weights", weights, "--prompt", prompt, "--max-new-tokens", "4"]),
        2,
        /^gpt2: --prompt is 37 tokens; with --max-new-tokens 4 .* the model's 32 positions/,
        "a prompt longer than the context",
      );
      const first = await run(GPT2, flags);
      assert.equal(first.code, 0, first.stderr);
      const saved = await Deno.readFile(path);
      // The same command again: it used to train and replace the saved run.
      assertRefusedWith(
        await run(GPT2, flags),
        2,
        /^gpt2: --save .*run\.safetensors holds a saved run \(step 1\); continue it with --resume .*run\.safetensors, or add --overwrite to start over/,
        "a second --save",
      );
      // Weights of ~1e30 after one step: finite, but the validation loss is NaN.
      const diverged = await run(GPT2, [...flags, "--overwrite", "--lr", "1e30", "--amp", "bf16"]);
      assert.equal(diverged.code, 3, diverged.stderr);
      assert.match(errorLines(diverged).at(-1)!, /diverged at step 1: the evaluation loss is NaN/);
      assert.deepEqual(await Deno.readFile(path), saved, "the good file is untouched");
      assert.ok(!(await exists(`${path}.lock`)), "no lock left behind");
      // Resuming the finished run: its validation loss, and no "NaN → NaN".
      const text = flags.filter((f) => f !== "--json");
      const finished = await run(GPT2, [...text, "--resume", path]);
      assert.equal(finished.code, 0, finished.stderr);
      assert.doesNotMatch(finished.stdout, /NaN/);
      assert.match(finished.stdout, /holds a finished run \(step 1 of 1\): nothing left to train/);
      assert.match(finished.stdout, /validation loss \d+\.\d+ \(nothing left to train\)/);
      // One reader of config.json: a damaged one beside the weights is refused, not ignored.
      const other = join(dir, "other");
      await Deno.mkdir(other);
      await Deno.copyFile(weights, join(other, "model.safetensors"));
      await Deno.writeTextFile(join(other, "config.json"), "{ n_head: 4");
      assertRefusedWith(
        await run(GPT2, ["--weights", join(other, "model.safetensors"), "--prompt", "Hi"]),
        2,
        /^gpt2: --weights .*model\.safetensors: GPT-2: .*config\.json cannot be read as JSON/,
        "a damaged config.json",
      );
    });
  },
});

/**
 * Runs gpt2.ts to its end; when it reports saving `path` at `step`, copies
 * the file to `copy` (the run goes on and later saves replace `path`).
 */
async function copyWhenSaved(args: string[], path: string, step: number, copy: string) {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-read",
      "--allow-env",
      "--allow-write",
      ...BACKEND_PERMISSIONS,
      GPT2,
      ...args,
    ],
    env: { DENO_WEBGPU_BACKEND: "vulkan,metal,dx12", NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  let stdout = "", copied = false;
  for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
    stdout += chunk;
    const saved = events(stdout).some((e) => e.event === "save" && e.step === step);
    if (saved && !copied) {
      copied = true;
      await Deno.copyFile(path, copy);
    }
  }
  return { code: (await child.status).code, stdout, stderr: await stderr };
}

/** The tensors and metadata of a saved run, for comparing bit for bit. */
async function savedRun(path: string) {
  const { entries, metadata } = await loadSafetensors(path);
  return { metadata, tensors: [...entries].map(([name, e]) => [name, e.dtype, e.shape, e.data]) };
}

Deno.test({
  name: "gpt2.ts: a run saved at step 3 and resumed to step 6 gives the losses and the saved " +
    "run (weights, AdamW, schedule, data order) of the uninterrupted run, bit for bit",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const weights = await checkpoint(dir), data = join(dir, "text.txt");
      await Deno.writeTextFile(data, TEXT);
      const whole = join(dir, "whole.safetensors"), half = join(dir, "half.safetensors");
      const flags = [
        ...["--weights", weights, "--data", data, "--context", "16", "--batch", "2"],
        ...["--steps", "6", "--lr", "3e-3", "--warmup", "2", "--eval-every", "3"],
        ...["--eval-windows", "2", "--log-every", "1", "--json"],
      ];
      const first = await copyWhenSaved([...flags, "--save", whole], whole, 3, half);
      assert.equal(first.code, 0, first.stderr);
      const step3 = JSON.parse((await loadSafetensors(half)).metadata.extra);
      assert.equal(step3.step, 3, "the copy is the run at step 3");
      assert.notDeepEqual(await savedRun(half), await savedRun(whole), "steps 4 to 6 trained");
      const resumed = await run(GPT2, [...flags, "--save", half, "--resume", half]);
      assert.equal(resumed.code, 0, resumed.stderr);
      // The losses after step 3, without the seconds per step (which differ between runs).
      const losses = (r: Run) =>
        events(r.stdout)
          .filter((e) => (e.event === "step" || e.event === "eval") && (e.step as number) > 3)
          .map(({ secondsPerStep: _, ...rest }) => rest);
      assert.equal(losses(resumed).length, 4, "steps 4, 5, 6 and the validation at 6");
      assert.deepEqual(losses(resumed), losses(first));
      assert.deepEqual(await savedRun(half), await savedRun(whole), "the saved runs");
    });
  },
});

Deno.test({
  name: "gpt2.ts preflight: sizes over this adapter's one-buffer limit stop before the model is " +
    "built, naming the flag to lower",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const data = join(dir, "text.txt");
      await Deno.writeTextFile(data, TEXT.repeat(40));
      const r = await run(GPT2, [
        ...["--random", "124M", "--data", data, "--batch", "400", "--context", "1024"],
      ]);
      assertRefused(
        r,
        /the MLP's hidden rows f32 \[409600, 3072\] needs .* lower --batch to about \d+/,
        "batch 400",
      );
    });
  },
});

Deno.test({
  name: "tiny_gpt.ts --data FILE: the character model trains on the given text and samples " +
    "from its characters",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const data = join(dir, "abc.txt");
      await Deno.writeTextFile(
        data,
        Array.from({ length: 300 }, (_, i) => "abcab"[i % 5]).join("") + "\n",
      );
      const r = await run(TINY_GPT, [
        ...["--data", data, "--steps", "40", "--log-every", "20", "--context", "16"],
        ...["--layers", "1", "--dim", "16", "--heads", "2", "--eval-windows", "3", "--json"],
      ]);
      assert.equal(r.code, 0, r.stderr);
      const final = events(r.stdout).find((e) => e.event === "final")!;
      const samples = final.samples as string[];
      assert.equal(samples.length, 8);
      assert.ok(
        samples.join("").length > 0 && /^[abc]*$/.test(samples.join("")),
        samples.join("|"),
      );
      assert.ok((final.validationLoss as number) < (final.bigramLoss as number) + 0.5);
      const short = join(dir, "short.txt");
      await Deno.writeTextFile(short, "tiny");
      assertRefused(
        await run(TINY_GPT, ["--data", short]),
        /each part needs --context \+ 1/,
        "too short",
      );
    });
  },
});
