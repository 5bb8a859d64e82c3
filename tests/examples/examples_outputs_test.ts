/**
 * One rule for every file the examples write (issue 47, 2): gpt2.ts
 * `--save-weights` onto its own `--weights` file, or onto any existing file,
 * used to replace it with exit status 0; now an output that is one of the
 * run's inputs is refused even with `--overwrite`, an existing file is
 * replaced only with `--overwrite`, two outputs may not name one file, and
 * each refusal is one line and exit status 2 before anything loads — in
 * gpt2.ts, mnist.ts (`--plot`) and tiny_gpt.ts (`--save-nanogpt`, `--plot`)
 * alike, through examples/runs/outputs.ts. The Python tools' side is in
 * tests/torch/torch_tools_test.ts.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  assertRefused,
  GPT2,
  MNIST,
  QUICK,
  run,
  TINY_GPT,
  withTempDir,
} from "../helpers/examples.ts";
import { checkOutputsReplace, sameFile } from "../../examples/runs/outputs.ts";
import { UsageError } from "../../examples/cli/flags.ts";

/** Files with known bytes in `dir`: what a refusal must leave untouched. */
async function files(dir: string, names: string[]): Promise<Map<string, Uint8Array>> {
  const made = new Map<string, Uint8Array>();
  for (const [i, name] of names.entries()) {
    const bytes = new TextEncoder().encode(`${name}: the user's file ${i}\n`);
    await Deno.writeFile(join(dir, name), bytes);
    made.set(join(dir, name), bytes);
  }
  return made;
}

/** Asserts that every file of `made` still holds its bytes. */
async function assertUntouched(made: Map<string, Uint8Array>, what: string): Promise<void> {
  for (const [path, bytes] of made) {
    assert.deepEqual(await Deno.readFile(path), bytes, `${what}: ${path} untouched`);
  }
}

Deno.test("gpt2.ts: --save-weights onto --weights, --data or an existing file, and --save and --save-weights on one file, are refused in one line before anything loads", async () => {
  await withTempDir(async (dir) => {
    const made = await files(dir, ["model.safetensors", "text.txt", "old.safetensors"]);
    const weights = join(dir, "model.safetensors"), data = join(dir, "text.txt");
    const base = ["--weights", weights, "--data", data, "--steps", "1", "--json"];
    const cases: [string, string[], RegExp][] = [
      [
        "onto --weights",
        ["--save-weights", weights, "--overwrite"],
        /^gpt2: --save-weights .*model\.safetensors is the file of --weights, which this run reads: writing it would replace it; give another path\.$/,
      ],
      [
        "onto --weights through another path",
        ["--save-weights", join(dir, ".", "model.safetensors")],
        /is the file of --weights, which this run reads/,
      ],
      [
        "onto the config.json beside --weights",
        ["--save-weights", join(dir, "config.json"), "--overwrite"],
        /--save-weights .*config\.json is the file of --weights/,
      ],
      ["onto --data", ["--save-weights", data], /--save-weights .*text\.txt is the file of --data/],
      [
        "onto an existing file",
        ["--save-weights", join(dir, "old.safetensors")],
        /^gpt2: --save-weights .*old\.safetensors already exists; add --overwrite to replace it, or give another path\.$/,
      ],
      [
        "--save and --save-weights on one file",
        ["--save", join(dir, "new.safetensors"), "--save-weights", join(dir, "new.safetensors")],
        /--save .*new\.safetensors and --save-weights .*new\.safetensors name one file/,
      ],
    ];
    await Deno.writeTextFile(join(dir, "config.json"), '{"n_head": 4}');
    made.set(join(dir, "config.json"), await Deno.readFile(join(dir, "config.json")));
    for (const [what, flags, message] of cases) {
      assertRefused(await run(GPT2, [...base, ...flags]), message, what);
      await assertUntouched(made, what);
    }
    assert.ok(!(await Deno.stat(join(dir, "new.safetensors")).then(() => true, () => false)));
  });
});

Deno.test("mnist.ts and tiny_gpt.ts: --plot, its heat map and --save-nanogpt replace an existing file only with --overwrite, and never the --data file", async () => {
  await withTempDir(async (dir) => {
    const made = await files(dir, ["loss.svg", "h.numerics.svg", "model.safetensors", "t.txt"]);
    const cases: [string, string, string[], RegExp][] = [
      [
        "mnist --plot onto a file",
        MNIST,
        [...QUICK, "--plot", join(dir, "loss.svg")],
        /^mnist: --plot .*loss\.svg already exists; add --overwrite to replace it, or give another path\.$/,
      ],
      [
        "mnist: the heat map beside --plot onto a file",
        MNIST,
        [...QUICK, "--plot", join(dir, "h.svg"), "--inspect"],
        /^mnist: the heat map .*h\.numerics\.svg \(of --plot\) already exists; add --overwrite/,
      ],
      [
        "tiny_gpt --save-nanogpt onto a file",
        TINY_GPT,
        ["--steps", "1", "--save-nanogpt", join(dir, "model.safetensors")],
        /^tiny_gpt: --save-nanogpt .*model\.safetensors already exists; add --overwrite/,
      ],
      [
        "tiny_gpt --plot onto --data",
        TINY_GPT,
        ["--steps", "1", "--data", join(dir, "t.txt"), "--plot", join(dir, "t.txt"), "--overwrite"],
        /^tiny_gpt: --plot .*t\.txt is the file of --data, which this run reads/,
      ],
    ];
    for (const [what, script, flags, message] of cases) {
      const r = await run(script, [...flags, "--json"]);
      assert.equal(r.code, 2, `${what}: ${r.stderr}`);
      assertRefused(r, message, what);
      await assertUntouched(made, what);
    }
  });
});

Deno.test("the output rule: an input is refused even with overwrite, a resumed run may write its own file, two outputs may not meet through a link, a replaceable output needs no overwrite", async () => {
  await withTempDir(async (dir) => {
    await files(dir, ["run.safetensors", "in.txt", "plot.svg"]);
    const run = join(dir, "run.safetensors"), link = join(dir, "latest.safetensors");
    await Deno.symlink(run, link);
    const refused = (promise: Promise<void>, message: RegExp) =>
      assert.rejects(promise, (e) => e instanceof UsageError && message.test(e.message));
    const inputs = [{ flag: "data", path: join(dir, "in.txt") }, { flag: "resume", path: run }];
    // --save onto --resume's file is the resumed run going on: neither an input nor a refusal.
    await checkOutputsReplace([{ flag: "save", path: link, continues: run }], {
      inputs,
      overwrite: false,
    });
    await refused(
      checkOutputsReplace([{ flag: "plot", path: link }], { inputs, overwrite: true }),
      /^--plot .*latest\.safetensors is the file of --resume/,
    );
    await refused(
      checkOutputsReplace([{ flag: "save", path: run }, { flag: "plot", path: link }], {
        inputs: [],
        overwrite: true,
      }),
      /name one file/,
    );
    await refused(
      checkOutputsReplace([{ flag: "plot", path: join(dir, "plot.svg") }], {
        inputs,
        overwrite: false,
      }),
      /already exists; add --overwrite/,
    );
    for (const [replaceable, overwrite] of [[true, false], [false, true]]) {
      await checkOutputsReplace([{ flag: "plot", path: join(dir, "plot.svg"), replaceable }], {
        inputs,
        overwrite,
      });
    }
    assert.ok(await sameFile(join(dir, "new.svg"), join(dir, ".", "new.svg")), "not there yet");
    assert.ok(!(await sameFile(join(dir, "a.svg"), join(dir, "b.svg"))));
  });
});
