/**
 * The row kernels (LayerNorm, softmax, log-softmax, cross-entropy; forward
 * and backward) against the f64 references at odd and vec4-sized row
 * lengths and several row counts, f32, f16 and bf16, on every row path:
 * the CPU adapter's (a thread per row up to 4096 entries), and as a GPU with
 * several rows per workgroup through workgroup memory and through subgroups.
 * bf16 rows of odd length share words with their neighbours, so this also
 * checks that no row's stores clobber the next row's first entry.
 */
import assert from "node:assert/strict";
import { DTYPES, type FloatDType, logSoftmax, softmax, Tensor, tidy } from "../../../gpu/mod.ts";
import { layerNorm } from "../../../gpu/mod.ts";
import { crossEntropyPerRow } from "../../../gpu/mod.ts";
import { launchLayerNorm, launchLayerNormFromStats } from "../../../gpu/kernels/rows/layer_norm.ts";
import { softmaxForwardKernel } from "../../../gpu/kernels/rows/softmax.ts";
import { rowSettings } from "../../../gpu/kernels/rows/row_layout.ts";
import {
  dispatchedKernels,
  dispatchedKernelsAsync,
  gpu,
  GPU_TEST,
  withSettings,
} from "../../helpers/gpu.ts";
import { layerNormCase } from "../../helpers/layer_norm_case.ts";
import { assertPathKeys, ROW_PATHS, type RowPath } from "../../helpers/row_paths.ts";
import { crossEntropy64, quantize, uniform } from "../../helpers/reference.ts";
import { checkSoftmaxCase } from "../../helpers/softmax_case.ts";
import { assertClose, TOL, type Tolerance } from "../../helpers/assert.ts";

/** [rows, cols]: one-entry rows, odd lengths (65, 383, 4097), and vec4 lengths (20, 384, 4096). */
const SHAPES = [[7, 1], [70, 65], [33, 383], [3, 4097], [9, 20], [33, 384], [2, 4096]];

const FLOATS = DTYPES.filter((d) => d !== "f16" || gpu.f16);

// Row statistics in f32 over up to 4097 terms (their order differs per path).
const STAT_TOL: Tolerance = { atol: 2e-4, rtol: 1e-4 };

/**
 * Runs `check` on `path` for every shape and dtype (`label` names the case),
 * asserts the kernels whose keys start with `kernel` ran on the path's layout,
 * and returns those keys.
 */
async function checkEveryCase(
  path: RowPath,
  kernel: string,
  check: (rows: number, cols: number, dtype: FloatDType, label: string) => Promise<void>,
): Promise<string[]> {
  const keys = await dispatchedKernelsAsync(() =>
    path.run(async () => {
      for (const [rows, cols] of SHAPES) {
        for (const dtype of FLOATS) {
          await check(rows, cols, dtype, `${path.name} ${dtype} [${rows}, ${cols}]`);
        }
      }
    })
  );
  const ours = keys.filter((k) => k.startsWith(kernel));
  assertPathKeys(path, ours);
  return ours;
}

Deno.test({
  name: "row kernels: LayerNorm forward, backward and the recompute from saved statistics " +
    "match f64 on every row path, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const path of ROW_PATHS) {
      const norms = await checkEveryCase(path, "layer_norm_", async (rows, cols, dtype, label) => {
        const { g, tx, tw, tb, ref } = layerNormCase(rows, cols, dtype);
        const y = layerNorm(tx, { weight: tw, bias: tb });
        assertClose(await y.read(), ref.y, TOL[dtype], `y ${label}`);
        y.backward({ gradient: Tensor.from(g, [rows, cols], { dtype }) });
        assertClose(await tx.grad!.read(), ref.dx, TOL[dtype], `dx ${label}`);
        assertClose(await tw.grad!.read(), ref.dw, STAT_TOL, `dweight ${label}`);
        assertClose(await tb.grad!.read(), ref.db, STAT_TOL, `dbias ${label}`);
        // The recompute from saved statistics gives the forward's y bit for bit.
        const again = tidy(() => {
          const forward = launchLayerNorm(tx, tw, tb, 1e-5);
          return {
            y: forward.y,
            redo: launchLayerNormFromStats(tx, { weight: tw, bias: tb }, forward, dtype),
          };
        });
        assert.deepEqual(await again.redo.read(), await again.y.read(), `recompute ${label}`);
        for (const t of [tx, tw, tb]) t.grad!.dispose();
        for (const t of [tx, tw, tb, y, again.y, again.redo]) t.dispose();
      });
      // Parameter gradients: a workgroup per column on CPU adapters, two coalesced stages on GPUs.
      const columns = path.name === "cpu" ? "layer_norm_param_grad" : "layer_norm_column_partials";
      assert.ok(norms.some((k) => k.startsWith(columns)), `${path.name}: ${columns}`);
    }
  },
});

Deno.test({
  name: "row kernels: softmax and log-softmax forward and backward match f64 on every row path, " +
    "f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const path of ROW_PATHS) {
      await checkEveryCase(path, "softmax_", async (rows, cols, dtype, where) => {
        for (const log of [false, true]) {
          await checkSoftmaxCase(rows, cols, dtype, { log, seed: cols + 1, where });
        }
      });
    }
  },
});

Deno.test({
  name: "row kernels: cross-entropy (class weights, smoothing, an ignored row) forward and " +
    "backward match f64 on every row path, f32, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const path of ROW_PATHS) {
      await checkEveryCase(path, "cross_entropy_forward", async (rows, cols, dtype, shapeLabel) => {
        for (const weighted of [false, true]) {
          const n = rows * cols, label = `${shapeLabel} weighted ${weighted}`;
          const x = quantize(uniform(n, n + 3, -4, 4), dtype);
          const targets = Array.from(uniform(rows, 7, 0, cols), Math.floor);
          if (rows > 1) targets[1] = -100;
          const weight = weighted ? quantize(uniform(cols, 8, 0.5, 2), "f32") : null;
          const g = quantize(uniform(rows, 9, 0.5, 1.5), "f32");
          const tx = Tensor.from(x, [rows, cols], { dtype, requiresGrad: true });
          const tw = weight ? Tensor.from(weight, [cols]) : undefined;
          const ids = Tensor.from(targets, [rows], { dtype: "i32" });
          const { losses, targetWeights } = crossEntropyPerRow(tx, ids, {
            weight: tw,
            smoothing: 0.1,
          });
          const ref = crossEntropy64(x, targets, cols, {
            smoothing: 0.1,
            weight,
            reduction: "none",
          });
          assertClose(await losses.read(), ref.loss, STAT_TOL, `loss ${label}`);
          losses.backward({ gradient: Tensor.from(g, [rows]) });
          const dx = ref.grad.map((v, i) => v * g[Math.floor(i / cols)]);
          assertClose(await tx.grad!.read(), dx, TOL[dtype], `dx ${label}`);
          for (const t of [tx.grad!, tx, tw, ids, losses, targetWeights]) t?.dispose();
        }
      });
    }
  },
});

Deno.test({
  name:
    "row kernels: vec4 loads off (rowSettings.vec4 false) give the one-entry kernels, same results",
  ...GPU_TEST,
  async fn() {
    const x = uniform(5 * 384, 3, -2, 2);
    const run = async () => {
      const t = Tensor.from(x, [5, 384]);
      const keys = dispatchedKernels(() => tidy(() => void softmax(t)));
      const y = await tidy(() => softmax(t)).read();
      t.dispose();
      return { keys, y };
    };
    const wide = await run();
    const narrow = await withSettings(rowSettings.of(gpu), { vec4: false }, run);
    assert.ok(wide.keys[0].includes("width=4") && narrow.keys[0].includes("width=1"));
    assertClose(narrow.y, wide.y, TOL.f32, "softmax");
  },
});

Deno.test({
  name: "row kernels: i32 input to softmax, logSoftmax, crossEntropyPerRow is a clear error",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const ids = Tensor.from([1, 2, 3, 4], [1, 4], { dtype: "i32" });
      assert.throws(() => softmax(ids), /softmax: input i32 \[1, 4\] must be f32, f16 or bf16/);
      assert.throws(
        () => logSoftmax(ids),
        /logSoftmax: input i32 \[1, 4\] must be f32, f16 or bf16/,
      );
      assert.throws(
        () => crossEntropyPerRow(ids, Tensor.from([0], [1], { dtype: "i32" })),
        /crossEntropy: logits i32 \[1, 4\] must be f32, f16 or bf16/,
      );
    });
  },
});

Deno.test({
  name: "row kernels: a thread that owns a bf16 row stores its interior entries a word at a time",
  fn() {
    const config = { kind: "softmax", layout: "thread", lanes: 1, width: 1 } as const;
    assert.match(softmaxForwardKernel.wgsl({ ...config, dtype: "bf16" }), /st2_y\(/);
    assert.doesNotMatch(softmaxForwardKernel.wgsl({ ...config, dtype: "f16" }), /st2_y\(/);
    const lanes = { ...config, layout: "workgroup", lanes: 8, dtype: "bf16" } as const;
    assert.doesNotMatch(softmaxForwardKernel.wgsl(lanes), /st2_y\(/, "lanes interleave entries");
  },
});
