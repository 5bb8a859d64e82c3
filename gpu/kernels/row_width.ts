/**
 * How the row kernels (LayerNorm, softmax, cross-entropy) read and write a
 * row's entries: one at a time, or four at a time (vec4 loads and stores)
 * when the row length is a multiple of 4, so every row starts on a vec4 (and,
 * for bf16, on a whole pair of u32 words: no atomics on store).
 *
 * One kernel source serves both widths: it computes in `V` (`f32` or
 * `vec4<f32>`), loads with `ld(name, i)`/stores with `st(name, i, v)` at
 * index `i` in units of V, and folds a V into one f32 with `hsum`/`hmax`.
 * Row loops run over `p.cols / W` units. Storage goes through the kernel
 * accessors (gpu/kernel.ts), so f32, f16 and bf16 all work.
 */
import type { DType } from "../dtype.ts";
import type { ElementType } from "../kernel.ts";

/** Entries per load: 1, or 4 (vec4). */
export type RowWidth = 1 | 4;

/** The widest {@link RowWidth} rows of `cols` entries allow: 4 when `cols` is a multiple of 4. */
export function rowWidth(cols: number): RowWidth {
  return cols % 4 === 0 ? 4 : 1;
}

/** A row binding's element type at `width` (a float dtype, or vec4 of it). */
export function rowElement(dtype: DType, width: RowWidth): ElementType {
  return width === 4 ? `vec4<${dtype as "f32" | "f16" | "bf16"}>` : dtype;
}

/**
 * WGSL before `main`: `alias V` and `hsum`/`hmax` (NaN wins in `hmax`: it
 * needs `max_or_nan`, which every row reduction's helpers define).
 */
export function wgslRowWidth(width: RowWidth): string {
  return width === 4
    ? `alias V = vec4<f32>;
fn hsum(v: V) -> f32 { return (v.x + v.y) + (v.z + v.w); }
fn hmax(v: V) -> f32 { return max_or_nan(max_or_nan(v.x, v.y), max_or_nan(v.z, v.w)); }
`
    : `alias V = f32;
fn hsum(v: V) -> f32 { return v; }
fn hmax(v: V) -> f32 { return v; }
`;
}

/** WGSL loading unit `index` (in units of V) of binding `name`. */
export function ld(width: RowWidth, name: string, index: string): string {
  return `${width === 4 ? "ld4" : "ld"}_${name}(${index})`;
}

/** WGSL storing `value` (a V) as unit `index` of binding `name`. */
export function st(width: RowWidth, name: string, index: string, value: string): string {
  return `${width === 4 ? "st4" : "st"}_${name}(${index}, ${value});`;
}

/** WGSL loading the single entry at element index `element` of binding `name` (an f32). */
export function ldEntry(width: RowWidth, name: string, element: string): string {
  return width === 4
    ? `ld4_${name}((${element}) / 4u)[(${element}) % 4u]`
    : `ld_${name}(${element})`;
}
