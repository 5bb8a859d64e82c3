/**
 * CI's Dawn pass fails on an adapter without subgroup-matrix configs (issue
 * 47): the subgroup-matrix test files used to pass there with every test
 * ignored. Here one of them runs on Dawn with Mesa 26's lavapipe made to
 * list no config (`LP_NATIVE_VECTOR_WIDTH=128`, DESIGN.md): the file must
 * fail, saying why. Runs on the Dawn pass over lavapipe (where CI needs it);
 * on the builtin backend, and on a GPU, it is ignored, saying so.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "../helpers/bundle.ts";
import { ON_DAWN } from "../helpers/dawn_pass.ts";
import { gpu } from "../helpers/gpu.ts";

const LAVAPIPE = /llvmpipe/.test(gpu.adapterName);

Deno.test({
  name: "Dawn pass: a subgroup-matrix test file on an adapter with no config fails, naming why" +
    (ON_DAWN && LAVAPIPE ? "" : " (ignored: needs the Dawn pass on Mesa 26's lavapipe)"),
  ignore: !(ON_DAWN && LAVAPIPE),
  async fn() {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "test",
        "--allow-all",
        "--no-check",
        join(ROOT, "tests/gpu/kernels/matmul_subgroup_matrix_test.ts"),
      ],
      env: { HALFSTEP_BACKEND: "dawn", LP_NATIVE_VECTOR_WIDTH: "128", NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const output = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
    assert.ok(!out.success, `the file passed with its tests ignored:\n${output.slice(-2000)}`);
    assert.match(output, /lists no f16→f32 subgroup-matrix config through Dawn/);
    assert.match(output, /\d+ ignored/, "the other tests were ignored: that is what fails it");
  },
});
