/**
 * examples/gpu_check.ts, the one command for a lent GPU, as CI can run it:
 * at the small size on this machine's adapter it runs every part to the end
 * within its default budget (in CI's Dawn pass, Mesa 26's lavapipe: every
 * subgroup-matrix candidate checked against f64 and found correct); with
 * its budget cut to a few seconds it stops cleanly, keeping what finished as
 * JSON lines and saying which parts ran out of time.
 *
 * Alone on Dawn (.ci/run runs it after the parallel part of the Dawn pass):
 * its parts are held to their shares of the budget, and beside another test
 * file on CI's two cores the Dawn parts ran 2.7x slower than alone (110 s).
 */
import assert from "node:assert/strict";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { f16MatrixConfig } from "../helpers/internals.ts";

const SCRIPT = new URL("../../examples/gpu_check.ts", import.meta.url).pathname;

/** Runs the check with `args`; its JSON lines, exit code and wall seconds. */
async function gpuCheck(args: string[]) {
  const started = performance.now();
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--v8-flags=--expose-gc", SCRIPT, "--size", "small", ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  const lines = text.split("\n").filter((l) => l.trim() !== "");
  // stdout carries JSON lines only.
  const rows = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  const seconds = (performance.now() - started) / 1000;
  return { rows, code: out.code, seconds, stderr: new TextDecoder().decode(out.stderr) };
}

/** Whether this run has Dawn with subgroup matrices (CI's Dawn pass) or only Deno's WebGPU. */
const matrices = gpu.backend === "dawn" && f16MatrixConfig(gpu.subgroupMatrixConfigs) !== undefined;

Deno.test({
  name: "gpu check: at the small size every part runs to the end within its default budget, " +
    (matrices
      ? "every subgroup-matrix candidate correct against f64"
      : "Dawn's parts unavailable here (no Mesa 26)"),
  ...GPU_TEST,
  async fn() {
    const { rows, code, seconds, stderr } = await gpuCheck([]);
    const summary = rows.at(-1)!;
    assert.equal(summary.part, "summary", stderr.slice(-2000));
    assert.equal(code, 0, JSON.stringify(summary));
    assert.ok(seconds < 480 + 60, `${seconds} s within the 480 s budget`);
    const status = summary.statuses as Record<string, string>;
    for (const part of ["adapter", "matmul", "gpt"]) {
      assert.equal(status[`builtin ${part}`], "done");
    }
    const builtin = rows.find((r) => r.part === "adapter" && r.backend === "builtin" && r.adapter);
    assert.ok(builtin, "the builtin adapter is described");
    const gptRows = rows.filter((r) => r.part === "gpt" && r.backend === "builtin" && r.msPerStep);
    assert.deepEqual(gptRows.map((r) => r.mode), ["f32", "amp", "amp captured"]);
    // The captured step's wall time against its GPU time (on a GPU: within 5%).
    const captured = rows.find((r) => r.part === "gpt" && r.mode === "captured");
    assert.ok(captured && (captured.wallOverGpu as number) > 0, JSON.stringify(captured));
    if (!matrices) {
      for (const part of ["adapter", "correct", "matmul", "gpt"]) {
        assert.equal(status[`dawn ${part}`], "unavailable", part);
      }
      return;
    }
    for (const part of ["adapter", "correct", "matmul", "gpt"]) {
      assert.equal(status[`dawn ${part}`], "done", part);
    }
    const checks = rows.filter((r) => r.part === "correct" && r.kernel);
    const kernels = new Set(checks.map((r) => r.kernel));
    assert.deepEqual([...kernels].sort(), ["attention", "conv2d", "matmul"]);
    for (const r of checks) assert.equal(r.ok, true, JSON.stringify(r));
    const matmul = rows.filter((r) => r.part === "matmul" && r.backend === "dawn" && r.summary);
    assert.deepEqual(matmul.map((r) => r.orientation), ["nn", "nt", "tn"]);
    for (const r of matmul) assert.ok((r.bestMatrixTflops as number) > 0, JSON.stringify(r));
  },
});

Deno.test({
  name: "gpu check: with its budget cut to 5 seconds it stops cleanly, keeping JSON lines of " +
    "what finished and naming the parts that ran out of time",
  ...GPU_TEST,
  async fn() {
    const { rows, code, seconds } = await gpuCheck(["--budget", "5"]);
    assert.equal(code, 1);
    const summary = rows.at(-1)!;
    assert.equal(summary.part, "summary");
    assert.equal(summary.ok, false);
    const statuses = Object.values(summary.statuses as Record<string, string>);
    assert.ok(statuses.includes("out of time"), statuses.join(", "));
    // Each backend's process is ended 15 s past its share, and starting a device takes seconds.
    assert.ok(seconds < 5 + 2 * 15 + 60, `${seconds} s`);
    // What ran is kept: the builtin adapter's line at least.
    assert.ok(rows.some((r) => r.part === "adapter" && r.backend === "builtin" && r.adapter));
  },
});
