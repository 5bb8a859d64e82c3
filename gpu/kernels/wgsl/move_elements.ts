/**
 * Kernels that move elements without computing on them (narrow, permute, the
 * embedding gather) copy bits, so every dtype moves bit-exactly, NaN payloads
 * included. f32, f16 and i32 move one element per thread. bf16 is packed two
 * to a 32-bit word, so a thread builds one whole output word from the two
 * elements' halves and stores it: no two threads write one word, and no
 * atomics or rounding are needed (a round trip through f32 would turn every
 * NaN into 0x7FC0).
 */
import type { DType } from "../../base/dtype.ts";
import type { ElementType } from "../../device/kernel.ts";
import { grid1d, WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "./grid.ts";

const WORKGROUP = 256;

/** What `source_index` returns for an output element that is zero (narrow's gradient padding). */
export const WGSL_ZERO_SOURCE = "0xffffffffu";

/** The element type a moving kernel binds `dtype` as: bf16's raw words (u32), else the dtype. */
export function movedType(dtype: DType): ElementType {
  return dtype === "bf16" ? "u32" : dtype;
}

/**
 * The WGSL `main` of a moving kernel: output element `i` (of `count`, a WGSL
 * expression) of binding `y` takes element `source_index(i)` of binding `x`,
 * or zero where that is {@link WGSL_ZERO_SOURCE}. The caller's WGSL defines
 * `fn source_index(i: u32) -> u32` before it.
 */
export function wgslMoveMain(dtype: DType, x: string, y: string, count: string): string {
  const thread = `${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid`;
  if (dtype !== "bf16") {
    return `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${thread};
  if (i >= ${count}) { return; }
  let j = source_index(i);
  if (j == ${WGSL_ZERO_SOURCE}) { ${y}[i] = ${dtype}(0); } else { ${y}[i] = ${x}[j]; }
}`;
  }
  return `fn moved_bits(i: u32) -> u32 {
  let j = source_index(i);
  if (j == ${WGSL_ZERO_SOURCE}) { return 0u; }
  return (${x}[j >> 1u] >> ((j & 1u) * 16u)) & 0xffffu;
}
@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let w = ${thread};
  let i = 2u * w;
  if (i >= ${count}) { return; }
  var word = moved_bits(i);
  if (i + 1u < ${count}) { word |= moved_bits(i + 1u) << 16u; }
  ${y}[w] = word;
}`;
}

/**
 * The WGSL `main` of a kernel that computes each output element alone:
 * element `i` (of `count`) of binding `y` is `value(i)`, a
 * `fn value(i: u32) -> f32` the caller's WGSL defines. bf16 goes a word per
 * thread as above (one `st2_` store, no atomics); other dtypes an element.
 * Dispatch it over {@link moveGrid}.
 */
export function wgslComputeMain(dtype: DType, y: string, count: string): string {
  const thread = `${WGSL_WORKGROUP_INDEX} * ${WORKGROUP}u + lid`;
  if (dtype !== "bf16") {
    return `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let i = ${thread};
  if (i < ${count}) { st_${y}(i, value(i)); }
}`;
  }
  return `@compute @workgroup_size(${WORKGROUP})
fn main(${WGSL_GRID_BUILTINS}) {
  let w = ${thread};
  let i = 2u * w;
  if (i >= ${count}) { return; }
  var second = 0.0;
  if (i + 1u < ${count}) { second = value(i + 1u); }
  st2_${y}(w, vec2<f32>(value(i), second));
}`;
}

/** The grid of a moving or computing kernel over `n` output elements of `dtype` (a thread per bf16 word). */
export function moveGrid(dtype: DType, n: number): [number, number] {
  const threads = dtype === "bf16" ? Math.ceil(n / 2) : n;
  return grid1d(Math.ceil(threads / WORKGROUP));
}
