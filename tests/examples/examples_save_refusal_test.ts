/**
 * A save never replaces a run the user did not ask to replace (issue 39):
 * rerunning a `--save` command without `--resume` is refused before
 * training, `--overwrite` starts over; a `--resume` file that cannot
 * continue here — missing, a model file, a training state another program
 * wrote without mnist.ts's record (`saveTrainingState` alone, or
 * `to_halfstep.py`) — is refused in one line before start-up, with no stack
 * trace and no lock left behind.
 *
 * Default pass only (.ci/run leaves it out of the Dawn pass): it runs the
 * examples as a user does, in subprocesses, whose kernels the Dawn pass
 * tests in process (and the examples on Dawn: dawn_backend_test.ts).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Adam, AmpTrainer, decodeSafetensors } from "../../mod.ts";
import { saveModule, saveTrainingState } from "../../files.ts";
import { mnistModel } from "../../examples/mnist/model.ts";
import {
  assertRefused,
  errorLines,
  events,
  MNIST,
  QUICK,
  run,
  withTempDir,
} from "../helpers/examples.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { runPython } from "../helpers/torch.ts";

const exists = (path: string) => Deno.stat(path).then(() => true, () => false);

/** The run record mnist.ts saved in a training state. */
async function recordOf(path: string): Promise<Record<string, unknown>> {
  return JSON.parse(decodeSafetensors(await Deno.readFile(path)).metadata.extra);
}

Deno.test("examples: --save over a saved run without --resume is refused before training; --overwrite starts over", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "run.safetensors");
    const first = await run(MNIST, [...QUICK, "--save", path, "--json"]);
    assert.equal(first.code, 0, first.stderr);
    const saved = await Deno.readFile(path);
    // The README's first command, run again: it used to train an epoch and replace the run.
    const again = await run(MNIST, [...QUICK, "--save", path, "--json"]);
    assertRefused(
      again,
      /^mnist: --save .*run\.safetensors holds a saved run \(epoch 1, step 8\); continue it with --resume .*run\.safetensors, or add --overwrite to start over/,
      "a second --save",
    );
    assert.deepEqual(await Deno.readFile(path), saved, "the saved run is untouched");
    assert.ok(!(await exists(`${path}.lock`)), "no lock left behind");
    // --resume of the same file goes on saving there; --overwrite starts a new run.
    const over = await run(MNIST, [
      ...QUICK,
      "--seed",
      "1",
      "--save",
      path,
      "--overwrite",
      "--json",
    ]);
    assert.equal(over.code, 0, over.stderr);
    assert.ok(events(over.stdout).some((e) => e.event === "save"));
    const record = await recordOf(path);
    assert.equal((record.flags as { shape: { seed: number } }).shape.seed, 1, "the new run");
    assert.equal(record.step, 8);
    assertRefused(
      await run(MNIST, [...QUICK, "--overwrite", "--json"]),
      /^mnist: --overwrite is for --save/,
      "--overwrite alone",
    );
  });
});

/** Asserts a refused resume: exit status 1, one line matching `message`, nothing started. */
function assertResumeRefused(r: { code: number; stdout: string; stderr: string }, message: RegExp) {
  assert.equal(r.code, 1, r.stderr);
  const lines = errorLines(r);
  assert.equal(lines.length, 1, `one line, no stack trace: ${JSON.stringify(lines)}`);
  assert.match(lines[0], message);
  assert.equal(r.stdout.trim(), "", "refused before start-up (no start event)");
}

Deno.test({
  name: "examples: a --resume file mnist.ts cannot continue is refused in one line before " +
    "start-up, with no lock left",
  ...GPU_TEST,
  async fn() {
    await withTempDir(async (dir) => {
      const flags = (path: string) => [...QUICK, "--resume", path, "--save", path, "--json"];
      const missing = join(dir, "missing.safetensors");
      assertResumeRefused(
        await run(MNIST, flags(missing)),
        /^mnist: cannot resume: --resume .*missing\.safetensors: no such file$/,
      );
      // saveTrainingState without the example's `extra`: it used to crash with a TypeError.
      const model = mnistModel("mlp", 0), optimizer = new Adam(model.parameters());
      const trainer = new AmpTrainer(model, optimizer, { enabled: false });
      const partial = join(dir, "partial.safetensors");
      await saveTrainingState(partial, { model, optimizer, trainer });
      assertResumeRefused(
        await run(MNIST, flags(partial)),
        /^mnist: cannot resume: --resume .*partial\.safetensors: a training state without mnist\.ts's record of the run/,
      );
      assert.ok(!(await exists(`${partial}.lock`)), "no lock left behind");
      const weights = join(dir, "weights.safetensors");
      await saveModule(weights, model);
      assertResumeRefused(
        await run(MNIST, flags(weights)),
        /^mnist: cannot resume: --resume .*weights\.safetensors: not a halfstep training state/,
      );
      trainer.dispose();
      model.dispose();
      // A PyTorch run converted by to_halfstep.py: a whole training state, but no data order.
      const scripts = new URL("../../examples/torch/", import.meta.url).pathname;
      const checkpoint = join(dir, "torch.pt"), converted = join(dir, "converted.safetensors");
      await runPython(["-c", TORCH_CHECKPOINT, scripts, checkpoint]);
      await runPython([`${scripts}to_halfstep.py`, checkpoint, converted, "--optimizer", "Adam"]);
      assertResumeRefused(
        await run(MNIST, flags(converted)),
        /^mnist: cannot resume: --resume .*converted\.safetensors: a training state without mnist\.ts's record/,
      );
      assert.ok(!(await exists(`${converted}.lock`)), "no lock left behind");
    });
  },
});

/** A PyTorch checkpoint of the examples' MLP after one Adam step. */
const TORCH_CHECKPOINT = `
import sys, torch
sys.path.insert(0, sys.argv[1])
from continue_ddp import mnist_mlp
model = mnist_mlp()
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
model(torch.randn(4, 784)).square().mean().backward()
optimizer.step()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, sys.argv[2])
`;
