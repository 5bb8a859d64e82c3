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
 * accessors (gpu/device/kernel.ts), so f32, f16 and bf16 all work.
 */
import type { DType } from "../../base/dtype.ts";
import type { ElementType } from "../../device/kernel.ts";

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

/** What {@link wgslRowStores} needs of a kernel's config. */
export interface RowStoreConfig {
  /** Threads per row: pairs need a thread that owns its whole row (1). */
  lanes: number;
  /** Entries per unit. */
  width: RowWidth;
}

/**
 * WGSL storing entry j of the row (units from `base`, `n` of them) as
 * `value`, after the statements `body`, both written in terms of `j`, for
 * every j the thread's row loop `loop` visits. Where a thread owns a whole
 * bf16 row of one-entry units (rows of odd length share words with their
 * neighbours), interior entries go two per u32 word (`st2_`, one store)
 * and only a row's unpaired first and last entries take the single-entry
 * store (two atomics); otherwise each entry is stored on its own.
 */
export function wgslRowStores(
  c: RowStoreConfig & { dtype: DType },
  loop: string,
  store: { name: string; body: string; value: string },
): string {
  const { name, body, value } = store;
  if (c.lanes !== 1 || c.width !== 1 || c.dtype !== "bf16") {
    return `${loop} {
    ${body}
    ${st(c.width, name, "base + j", value)}
  }`;
  }
  const one = (j: string) => `{ let j = ${j}; ${body} st_${name}(base + j, ${value}); }`;
  // Not through `loop`, which hides rows past the end: `in_rows` guards them here.
  return `if (in_rows) {
  var jj = base & 1u;
  if (jj == 1u) ${one("0u")}
  for (; jj + 1u < n; jj += 2u) {
    var pair: vec2<f32>;
    { let j = jj; ${body} pair.x = ${value}; }
    { let j = jj + 1u; ${body} pair.y = ${value}; }
    st2_${name}((base + jj) / 2u, pair);
  }
  if (jj < n) ${one("jj")}
  }`;
}
