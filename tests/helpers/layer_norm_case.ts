/** One LayerNorm test case: seeded inputs, their tensors, and the f64 reference. */
import { type FloatDType, Tensor } from "../../gpu/mod.ts";
import { layerNorm64, quantize, uniform } from "./reference.ts";

/** The inputs of a [rows, cols] LayerNorm case, as values and as tensors that take gradients. */
export interface LayerNormCase {
  /** Input (rounded to `dtype`), upstream gradient (rounded to `dtype`), weight, bias. */
  x: Float64Array;
  g: Float64Array;
  w: Float64Array;
  b: Float64Array;
  /** `x` as a [rows, cols] `dtype` tensor; weight and bias as f32 [cols]. */
  tx: Tensor;
  tw: Tensor;
  tb: Tensor;
  /** The f64 reference (eps 1e-5): y, dx, dweight, dbias. */
  ref: ReturnType<typeof layerNorm64>;
}

/**
 * The case for [rows, cols] in `dtype`: x in [-2, 3), g in [-1, 1), weight in
 * [0.5, 1.5) and bias in [-1, 1) (both f32), seeded by the shape.
 */
export function layerNormCase(
  rows: number,
  cols: number,
  dtype: FloatDType,
): LayerNormCase {
  const n = rows * cols;
  const x = quantize(uniform(n, n + cols, -2, 3), dtype);
  const g = quantize(uniform(n, 11), dtype);
  const w = quantize(uniform(cols, 5, 0.5, 1.5), "f32");
  const b = quantize(uniform(cols, 6), "f32");
  return {
    x,
    g,
    w,
    b,
    tx: Tensor.from(x, [rows, cols], { dtype, requiresGrad: true }),
    tw: Tensor.from(w, [cols], { requiresGrad: true }),
    tb: Tensor.from(b, [cols], { requiresGrad: true }),
    ref: layerNorm64(x, g, cols, w, b, 1e-5),
  };
}
