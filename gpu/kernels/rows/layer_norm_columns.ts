/**
 * LayerNorm's parameter gradients on GPUs: dweight = Σ_rows g·x̂ and
 * dbias = Σ_rows g as column reductions in two coalesced stages (see
 * reduce_columns.ts): f32 partials of both per block of rows, then each
 * column's partials summed in block order, so runs repeat bit for bit. The
 * terms are those of `layerNormParamGradKernel`, which CPU adapters keep.
 */
import type { DType } from "../../base/dtype.ts";
import { defineKernel } from "../../device/kernel.ts";
import { DeviceArray } from "../../device/device_array.ts";
import {
  columnBlocks,
  columnDispatch,
  launchPartialsSumInto,
  wgslColumnMain,
} from "./reduce_columns.ts";

/** Per block of rows: partials of Σ g·x̂ in part[0, block, col], of Σ g in part[1, block, col]. */
export const layerNormColumnPartialsKernel = defineKernel({
  name: "layer_norm_column_partials",
  bindings: (c: { dtype: DType; grad: DType }) => [
    { name: "x", type: c.dtype },
    { name: "g", type: c.grad },
    { name: "mean", type: "f32" },
    { name: "rstd", type: "f32" },
    { name: "part", type: "f32", write: true },
  ],
  uniforms: {
    outer: "u32",
    rows: "u32",
    cols: "u32",
    block_rows: "u32",
    blocks: "u32",
    groups: "u32",
  },
  source: () =>
    wgslColumnMain(
      [
        { name: "sw", value: "ld_g(i) * (ld_x(i) - mean[r]) * rstd[r]" },
        { name: "sb", value: "ld_g(i)" },
      ],
      (total, term, k) =>
        term.name === "sw"
          ? `part[${k}] = ${total};`
          : `part[p.blocks * p.cols + ${k}] = ${total};`,
    ),
});

/**
 * dweight and/or dbias (f32 [cols], null where not wanted) of a LayerNorm
 * over x ([rows, cols]) with upstream `g` and the saved per-row statistics,
 * in two coalesced stages. No autograd.
 */
export function launchLayerNormColumnGradsInto(
  x: DeviceArray,
  g: DeviceArray,
  stats: { mean: DeviceArray; rstd: DeviceArray },
  size: { rows: number; cols: number },
  out: { dw: DeviceArray | null; db: DeviceArray | null },
): void {
  const { rows, cols } = size;
  const blocks = columnBlocks(rows);
  const part = DeviceArray.empty([2 * blocks.blocks * cols], "f32", x.gpu);
  const kernel = x.gpu.kernel(layerNormColumnPartialsKernel, { dtype: x.dtype, grad: g.dtype });
  const { uniforms, grid } = columnDispatch(1, rows, cols, blocks);
  x.gpu.dispatch(kernel, { x, g, mean: stats.mean, rstd: stats.rstd, part }, uniforms, grid);
  const partials = { outer: 1, rows: blocks.blocks, cols };
  if (out.dw) launchPartialsSumInto(part, partials, out.dw);
  if (out.db) launchPartialsSumInto(part, { ...partials, offset: blocks.blocks * cols }, out.db);
  part.dispose();
}
