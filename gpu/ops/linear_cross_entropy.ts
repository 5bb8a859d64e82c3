/**
 * A language model's head and its cross-entropy as one op that never holds
 * the whole logits (Liger-Kernel's fused linear cross-entropy): at a large
 * vocabulary the logits [rows, V] and their gradient are a step's largest
 * tensors (GPT-2 at batch 8 × 512 tokens: 823 MB each in f32).
 *
 * Forward, for each chunk of rows: the chunk's logits h·Wᵀ, their log-sum-exp
 * and the losses (the cross-entropy kernels), then the logits are dropped.
 * Kept for backward: h, W (the tape's handles of tensors that live anyway)
 * and two f32 numbers per row (the log-sum-exp and the target's coefficient).
 * Backward, for each chunk: the logits again, softmax − one-hot scaled by the
 * upstream gradient (the cross-entropy backward kernel), then dh = dlogits·W
 * (written into its rows of dh) and dW += dlogitsᵀ·h. At most one chunk's
 * logits and their gradient are alive, plus one chunk's dW before it is added.
 * One op with one gradient rule: the extra cost is the logits' product run
 * again in backward.
 */
import { record } from "../tensor/autograd.ts";
import { autocastInputs, releaseCasts } from "../tensor/autocast_hook.ts";
import { DTypeError, fail, ShapeError, ValueError } from "../base/errors.ts";
import {
  type CrossEntropyParams,
  type CrossEntropyRows,
  launchCrossEntropy,
  launchCrossEntropyBackward,
} from "../kernels/rows/cross_entropy.ts";
import { launchAccumulateInto, launchUnary } from "../kernels/elementwise.ts";
import { launchConcat, launchNarrow, launchNarrowInto } from "../kernels/narrow.ts";
import type { DeviceArray } from "../device/device_array.ts";
import { gradDtypeOf, Tensor } from "../tensor/tensor.ts";
import { assertTensors } from "./checks.ts";
import type { CrossEntropyPerRow } from "./cross_entropy.ts";
import { assertIdsInRange } from "./ids_check.ts";
import { weightGradTarget } from "./linear.ts";
import { product } from "./matmul.ts";

/** Logit elements per chunk by default: 2^23 (32 MiB in f32, 16 MiB in f16). */
export const LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS = 2 ** 23;

/** Options of {@link linearCrossEntropyPerRow}. */
export interface LinearCrossEntropyOptions {
  /** Rows whose target is this id add nothing (PyTorch's `ignore_index`, default −100). */
  ignoreIndex?: number;
  /**
   * Rows per chunk (default: as many as keep a chunk's logits within
   * {@link LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS}). Memory falls with it; the
   * number of dispatches grows.
   */
  chunkRows?: number;
}

/** Rows [start, start + length) of `x` (no copy when they are all of it). */
function rowsOf(x: Tensor, start: number, length: number): Tensor {
  return length === x.shape[0]
    ? x.share()
    : Tensor.adopt(launchNarrow(x, { axis: 0, start, length }));
}

/** Writes `src` at row `start` of `dst` (no autograd). */
function placeRows(dst: DeviceArray, src: DeviceArray, start: number): void {
  if (!launchNarrowInto(dst, src, { axis: 0, start, length: src.shape[0] })) {
    throw new Error("linearCrossEntropy: rows of odd bf16 length cannot be placed"); // f32 only here
  }
}

/** h and the weight as lists of feature pieces (one piece each when given whole). */
function piecesOf(h: Tensor | readonly Tensor[], w: Tensor | readonly Tensor[]) {
  const hs = h instanceof Tensor ? [h] : [...h], ws = w instanceof Tensor ? [w] : [...w];
  if (hs.length === 0 || hs.length !== ws.length) {
    fail(
      ShapeError,
      "linearCrossEntropy",
      `h and weight must be one tensor each or lists of as many feature pieces; got ` +
        `${hs.length} and ${ws.length}.`,
    );
  }
  return { hs, ws };
}

function checked(
  hs: readonly Tensor[],
  ws: readonly Tensor[],
  targets: Tensor,
  options: LinearCrossEntropyOptions,
) {
  const where = "linearCrossEntropy";
  const [rows, classes] = [hs[0].shape[0], ws[0].shape[0]];
  hs.forEach((h, i) => {
    const w = ws[i];
    if (
      h.rank !== 2 || w.rank !== 2 || h.shape[1] !== w.shape[1] || h.shape[0] !== rows ||
      w.shape[0] !== classes
    ) {
      fail(
        ShapeError,
        where,
        `needs h [rows, features] and weight [classes, features] (a Linear's layout); got h ` +
          `${h.describe()} and weight ${w.describe()}.`,
      );
    }
    if (h.dtype === "i32" || w.dtype !== h.dtype || h.dtype !== hs[0].dtype) {
      fail(
        DTypeError,
        where,
        `h ${h.describe()} and weight ${w.describe()} must share one float dtype (or run under ` +
          "autocast).",
      );
    }
  });
  if (targets.dtype !== "i32" || targets.rank !== 1 || targets.shape[0] !== rows) {
    fail(ShapeError, where, `targets must be i32 [${rows}], got ${targets.describe()}.`);
  }
  const ignoreIndex = options.ignoreIndex ?? -100;
  if (!Number.isInteger(ignoreIndex) || Math.abs(ignoreIndex) >= 2 ** 31) {
    fail(ValueError, where, `ignoreIndex must be a 32-bit integer, got ${ignoreIndex}.`);
  }
  const chunk = options.chunkRows ??
    Math.max(1, Math.floor(LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS / Math.max(classes, 1)));
  if (!Number.isInteger(chunk) || chunk < 1) {
    fail(ValueError, where, `chunkRows must be an integer >= 1, got ${options.chunkRows}.`);
  }
  assertIdsInRange(where, targets, classes, ignoreIndex);
  const params: CrossEntropyParams = { weight: null, ignoreIndex, smoothing: 0 };
  return { params, chunk };
}

/** A chunk's logits: Σ over pieces of hc·Wᵀ. */
function chunkLogits(hcs: readonly Tensor[], ws: readonly Tensor[]): Tensor {
  const logits = product(hcs[0], ws[0], false, true);
  for (let i = 1; i < hcs.length; i++) {
    const part = product(hcs[i], ws[i], false, true);
    launchAccumulateInto(logits, part, 1, 1);
    part.dispose();
  }
  return logits;
}

/**
 * The cross-entropy of `linear(h, weight)` against `targets`, row by row, as
 * `crossEntropyPerRow(linear(h, weight), targets)` gives it (within f32
 * rounding: the products run on chunks of rows), without ever holding all
 * the logits: h [rows, features], weight [classes, features] (PyTorch's
 * Linear layout, e.g. a tied embedding table), i32 targets [rows]. Gradients
 * flow to h and the weight. Under autocast (`"linear_cross_entropy"`, on the
 * f16 list) the products run in f16 or bf16 as a linear layer's would, the
 * cross-entropy in f32, and the weight's gradient is written in f32 into an
 * f32 master's.
 *
 * h and the weight may also come as lists of pieces along the features
 * (h [rows, fᵢ] and weight [classes, fᵢ] each): the logits are then the sum
 * of the pieces' products. A table too large for one buffer of the adapter
 * (GPT-2's 50257 × 768 in f32 is over WebGPU's default 128 MiB) is kept in
 * such column pieces.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, linearCrossEntropyPerRow, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const h = Tensor.from([1, 0, 0, 1, 1, 1], [3, 2], { requiresGrad: true }); // hidden rows
 * const w = Tensor.zeros([5, 2]); // 5 classes: all logits 0
 * const targets = Tensor.from([4, 0, 2], [3], { dtype: "i32" });
 * const { losses } = linearCrossEntropyPerRow(h, w, targets, { chunkRows: 2 });
 * const values = await losses.read();
 * for (const l of values) assert.ok(Math.abs(l - Math.log(5)) < 1e-6, `${l}`); // uniform: ln 5
 * gpu.destroy();
 * ```
 */
export function linearCrossEntropyPerRow(
  h0: Tensor | readonly Tensor[],
  weight0: Tensor | readonly Tensor[],
  targets: Tensor,
  options: LinearCrossEntropyOptions = {},
): CrossEntropyPerRow {
  const given = piecesOf(h0, weight0);
  assertTensors("linearCrossEntropy", ...given.hs, ...given.ws, targets);
  const cast = autocastInputs("linear_cross_entropy", [...given.hs, ...given.ws]);
  const k = given.hs.length, hs = cast.slice(0, k), ws = cast.slice(k);
  const { params, chunk } = checked(hs, ws, targets, options);
  // An f32 input cast down for the products gets its gradient in f32, straight from them.
  const hTargets = hs.map((h, i) => weightGradTarget(given.hs[i], h));
  const wTargets = ws.map((w, i) => weightGradTarget(given.ws[i], w));
  const rows = hs[0].shape[0];
  // Each chunk's per-row results, joined once at the end (f32 scalars per row: small).
  const parts: CrossEntropyRows[] = [];
  for (let start = 0; start < rows; start += chunk) {
    const n = Math.min(chunk, rows - start);
    const hcs = hs.map((h) => rowsOf(h, start, n)), tc = rowsOf(targets, start, n);
    const logits = chunkLogits(hcs, ws);
    parts.push(launchCrossEntropy(logits, tc, params));
    for (const t of [...hcs, tc, logits]) t.dispose();
  }
  const joined = (of: (p: CrossEntropyRows) => DeviceArray): Tensor => {
    if (parts.length === 1) return Tensor.adopt(of(parts[0]));
    const whole = Tensor.adopt(launchConcat(parts.map(of), 0));
    for (const p of parts) of(p).dispose();
    return whole;
  };
  const out = {
    loss: joined((p) => p.loss),
    targetWeight: joined((p) => p.targetWeight),
    stats: joined((p) => p.stats),
  };
  const losses = record({
    op: "linear_cross_entropy",
    inputs: [...hTargets, ...wTargets],
    output: out.loss,
    save: [...hs, ...ws, targets, out.stats],
    backward: (g, saved, needs) =>
      linearCrossEntropyBackward(g, {
        hs: saved.slice(0, k),
        ws: saved.slice(k, 2 * k),
        targets: saved[2 * k],
        stats: saved[2 * k + 1],
      }, {
        params,
        chunk,
        needs,
        dtypes: [...hTargets, ...wTargets].map(gradDtypeOf),
        narrowedGrads: wTargets.map((t) => gradDtypeOf(t) !== t.dtype),
      }),
  });
  out.stats.dispose(); // the tape holds its own handle
  releaseCasts([...hs, ...ws], losses);
  return { losses, targetWeights: out.targetWeight };
}

/** Each piece's dh and dW from the per-row gradient `g` (f32 [rows]), chunk by chunk. */
function linearCrossEntropyBackward(
  g: Tensor,
  saved: { hs: Tensor[]; ws: Tensor[]; targets: Tensor; stats: Tensor },
  how: {
    params: CrossEntropyParams;
    chunk: number;
    needs: readonly boolean[];
    dtypes: Tensor["dtype"][];
    /** Per table piece: whether it keeps a gradient narrower than itself (apex O2). */
    narrowedGrads: boolean[];
  },
): (Tensor | null)[] {
  const { hs, ws, targets, stats } = saved, { chunk, needs } = how, k = hs.length;
  const rows = hs[0].shape[0];
  const whole = rows <= chunk;
  // dh is written chunk by chunk in f32 (rows placed whole), then cast once if h is narrower.
  // NOTE: the one buffer here that the op allocates for kernels to write into (launchNarrowInto,
  // a slice of a bigger buffer): joining the chunks' parts at the end would hold dh twice.
  const dhs: (Tensor | null)[] = hs.map((h, i) =>
    needs[i] && !whole ? Tensor.empty(h.shape, "f32", h.gpu) : null
  );
  const dws: (Tensor | null)[] = ws.map(() => null);
  for (let start = 0; start < rows; start += chunk) {
    const n = Math.min(chunk, rows - start);
    const hcs = hs.map((h) => rowsOf(h, start, n));
    const [tc, sc, gc] = [targets, stats, g].map((t) => rowsOf(t, start, n));
    const logits = chunkLogits(hcs, ws);
    const dlogits = Tensor.adopt(launchCrossEntropyBackward(logits, tc, sc, gc, how.params));
    logits.dispose();
    for (let i = 0; i < k; i++) {
      if (needs[i]) {
        const part = product(dlogits, ws[i], false, false, "f32");
        if (whole) dhs[i] = part;
        else {
          placeRows(dhs[i]!, part, start);
          part.dispose();
        }
      }
      if (needs[k + i]) {
        // Over several chunks a half-precision table gradient (apex O2) is summed in f32 and
        // narrowed once at the end: each chunk's += would round it again.
        const sumIn = how.narrowedGrads[i] && !whole ? "f32" : how.dtypes[k + i];
        const part = product(dlogits, hcs[i], true, false, sumIn);
        if (dws[i] === null) dws[i] = part;
        else {
          launchAccumulateInto(dws[i]!, part, 1, 1);
          part.dispose();
        }
      }
    }
    for (const t of [...hcs, tc, sc, gc, dlogits]) t.dispose();
  }
  const castDh = dhs.map((dh, i) => {
    if (!dh || dh.dtype === how.dtypes[i]) return dh;
    const narrowed = Tensor.adopt(launchUnary("identity", dh, { out: how.dtypes[i] }));
    dh.dispose();
    return narrowed;
  });
  const castDw = dws.map((dw, i) => {
    if (!dw || dw.dtype === how.dtypes[k + i]) return dw;
    const narrowed = Tensor.adopt(launchUnary("identity", dw, { out: how.dtypes[k + i] }));
    dw.dispose();
    return narrowed;
  });
  return [...castDh, ...castDw];
}
