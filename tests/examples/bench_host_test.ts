/**
 * `bench host` (issue 45) runs on Dawn's null backend and gives its rows: for
 * each mode of the MNIST MLP (the entry's first model; the others take
 * minutes), the host's milliseconds of an uncaptured and a captured step with
 * the same dispatches, and PyTorch eager's on its meta device beside them
 * (CI has torch: its row must be there).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "../helpers/bundle.ts";
import { torchPython } from "../helpers/torch.ts";

Deno.test("bench host: uncaptured, captured and PyTorch rows for the MLP in every mode", async () => {
  const python = torchPython(); // fails, saying how to install it, where there is none
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", join(ROOT, "examples/bench.ts"), "host", "--steps", "2"],
    env: { HALFSTEP_BENCH_HOST_MODELS: "mlp", HALFSTEP_TORCH_PYTHON: python, NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, stderr.slice(-800));
  assert.match(stderr, /adapter: null-backend/);
  const rows = new TextDecoder().decode(out.stdout).trim().split("\n").map((l) => JSON.parse(l))
    .filter((r) => r.mode !== "wall time");
  assert.deepEqual(rows.map((r) => `${r.mode} ${r.run.replace(/PyTorch .*/, "PyTorch")}`), [
    "f32 uncaptured",
    "f32 captured",
    "f32 PyTorch",
    "amp uncaptured",
    "amp captured",
    "amp PyTorch",
    "amp+ckpt uncaptured",
    "amp+ckpt captured",
    "amp+ckpt PyTorch",
  ]);
  for (let i = 0; i < rows.length; i += 3) {
    const [uncaptured, captured, torch] = rows.slice(i, i + 3);
    assert.ok(uncaptured.dispatchesPerStep > 20, JSON.stringify(uncaptured));
    assert.equal(captured.dispatchesPerStep, uncaptured.dispatchesPerStep, "the same dispatches");
    for (const r of [uncaptured, captured, torch]) {
      assert.ok(r.hostMsMin > 0 && r.hostMsMedian >= r.hostMsMin, JSON.stringify(r));
      assert.equal(r.adapter, "null-backend");
    }
    assert.ok(captured.ratioToTorch > 0 && uncaptured.ratioToTorch > 0);
    assert.match(torch.run, /^PyTorch \S+ eager \(meta, f32\)$/);
  }
});
