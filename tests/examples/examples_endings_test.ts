/**
 * How a run ends says where the user stands (issue 47, 10): Ctrl-C ended
 * with exit status 130 and no word about which epoch the file holds; a run
 * with `--on-save-error continue` exited 0 after every save failed, without
 * saying that the file still held epoch 1, and printed the failure on stdout
 * (gpt2.ts on stderr); an unreadable `--data` was exit status 2 where an
 * unreadable `--weights` is 1 (and `--help` says 1).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  afterFirstSave,
  errorLines,
  GPT2,
  MNIST,
  QUICK,
  run,
  TINY_GPT,
  withTempDir,
} from "../helpers/examples.ts";

Deno.test("examples: Ctrl-C says which epoch the file holds and that --resume continues it", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "run.safetensors");
    const r = await afterFirstSave([
      ...QUICK.slice(0, 2),
      "--epochs",
      "3",
      "--save",
      path,
      "--json",
    ], () => "interrupt");
    assert.equal(r.code, 130, r.stderr);
    assert.equal(
      errorLines(r).at(-1),
      `mnist: interrupted; ${path} holds epoch 1 (step 8): add --resume ${path} to continue from there.`,
    );
    assert.ok(!(await Deno.stat(`${path}.lock`).then(() => true, () => false)), "no lock left");
  });
});

Deno.test("examples: with --on-save-error continue, a run whose last save failed ends saying what the file holds, on stderr, exit status 1", async () => {
  await withTempDir(async (dir) => {
    const out = join(dir, "out");
    await Deno.mkdir(out);
    const path = join(out, "run.safetensors");
    const args = [
      ...QUICK.slice(0, 2),
      "--epochs",
      "2",
      "--save",
      path,
      "--on-save-error",
      "continue",
    ];
    // Text output: the first save's line on stdout tells when to pull the folder away.
    const r = await afterFirstSaveText(args, out);
    assert.equal(r.code, 1, r.stderr);
    assert.doesNotMatch(r.stdout, /failed/, "the failure is not on stdout");
    assert.match(r.stderr, /^mnist: writing .*run\.safetensors failed: .*; training goes on$/m);
    assert.match(
      errorLines(r).at(-1)!,
      /^mnist: 1 save of .*run\.safetensors failed, the last one's included; the last save that succeeded holds epoch 1 \(step 8\): --resume .*run\.safetensors continues from there\.$/,
    );
  });
});

/** afterFirstSave for a text run: its "saved" line instead of the JSON event. */
async function afterFirstSaveText(args: string[], remove: string) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-read", "--allow-env", "--allow-write", MNIST, ...args],
    env: { DENO_WEBGPU_BACKEND: "vulkan,metal,dx12", NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  let stdout = "", acted = false;
  for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
    stdout += chunk;
    if (!acted && /^saved .*\(epoch 1\)$/m.test(stdout)) {
      acted = true;
      await Deno.remove(remove, { recursive: true });
    }
  }
  return { code: (await child.status).code, stdout, stderr: await stderr };
}

Deno.test("examples: an unreadable --data is exit status 1, as an unreadable --weights or --data-dir; a --data that is not UTF-8 text is 2", async () => {
  await withTempDir(async (dir) => {
    const missing = join(dir, "missing.txt"), binary = join(dir, "binary.txt");
    await Deno.writeFile(binary, new Uint8Array([0xff, 0xfe, 0x00, 0xc3]));
    const weights = join(dir, "model.safetensors");
    await Deno.writeFile(weights, new Uint8Array(16));
    const cases: [string, string, string[], number, RegExp][] = [
      [
        "gpt2 --data missing",
        GPT2,
        ["--random", "124M", "--data", missing],
        1,
        /^gpt2: --data .*missing\.txt: cannot be read \(/,
      ],
      [
        "gpt2 --weights missing",
        GPT2,
        ["--weights", missing, "--prompt", "Hi"],
        1,
        /^gpt2: --weights .*missing\.txt: /,
      ],
      [
        "tiny_gpt --data missing",
        TINY_GPT,
        ["--data", missing],
        1,
        /^tiny_gpt: --data .*missing\.txt: cannot be read \(/,
      ],
      [
        "mnist --data-dir missing",
        MNIST,
        ["--data-dir", join(dir, "none"), ...QUICK],
        1,
        /^mnist: /,
      ],
      [
        "gpt2 --data not UTF-8",
        GPT2,
        ["--random", "124M", "--data", binary],
        2,
        /^gpt2: --data .*binary\.txt: it is not UTF-8 text\.$/,
      ],
      [
        "tiny_gpt --data not UTF-8",
        TINY_GPT,
        ["--data", binary],
        2,
        /^tiny_gpt: --data .*binary\.txt: it is not UTF-8 text\.$/,
      ],
    ];
    for (const [what, script, args, code, message] of cases) {
      const r = await run(script, args);
      assert.equal(r.code, code, `${what}: ${r.stderr}`);
      const lines = errorLines(r);
      assert.equal(lines.length, 1, `${what}: ${JSON.stringify(lines)}`);
      assert.match(lines[0], message, what);
    }
  });
});
