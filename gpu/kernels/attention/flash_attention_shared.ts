/**
 * What both families of fused attention kernels share (the row plans of
 * flash_attention.ts and the register tiles of flash_attention_tiled.ts):
 * their uniforms, where a head's rows are in storage, the dropout factor of
 * one weight, and their bindings.
 */
import type { Binding } from "../../device/kernel.ts";

/** The uniforms of every fused attention kernel (see `setup` in flash_attention.ts). */
export const ATTENTION_UNIFORMS = {
  t: "u32",
  bh: "u32",
  heads: "u32",
  blocks: "u32",
  scale: "f32",
  p: "f32",
  keepScale: "f32",
  key: "u32",
  counter: "u32",
  inWidth: "u32",
  qOff: "u32",
  kOff: "u32",
  vOff: "u32",
} as const;

/**
 * WGSL: the dropout factor of entry (z, i, j) of the virtual [B·H, T, T]
 * weights: 0, or 1/(1 − p) when kept; 1 without dropout.
 */
export function keepFactor(dropout: boolean, i: string, j: string): string {
  if (!dropout) return "1.0";
  return `select(0.0, p.keepScale, random_uniform(p.key, p.counter + (z * p.t + ${i}) * p.t + ${j}) >= p.p)`;
}

// Element e of key, value, query and output-gradient row `row` of head z, as
// an index into its binding (`in0` and `head0` are the head's offsets in row
// 0 of its batch); kernels read and write them through the dtype accessors.
/** WGSL index of element `e` of key row `row`. */
export const K_INDEX = (row: string, e: string): string =>
  `in0 + ${row} * p.inWidth + p.kOff + ${e}`;
/** WGSL index of element `e` of value row `row`. */
export const V_INDEX = (row: string, e: string): string =>
  `in0 + ${row} * p.inWidth + p.vOff + ${e}`;
/** WGSL index of element `e` of query row `row`. */
export const Q_INDEX = (row: string, e: string): string =>
  `in0 + ${row} * p.inWidth + p.qOff + ${e}`;
/** WGSL index of element `e` of output (and output-gradient) row `row`. */
export const OUT_INDEX = (row: string, e: string): string => `head0 + ${row} * width + ${e}`;

/** Where a binding's rows are: its name and the WGSL index of element e of a row. */
export type AttentionRows = { name: string; index: (row: string, e: string) => string };

/** Query rows. */
export const QUERIES: AttentionRows = { name: "q", index: Q_INDEX };
/** Key rows. */
export const KEYS: AttentionRows = { name: "k", index: K_INDEX };
/** Value rows. */
export const VALUES: AttentionRows = { name: "v", index: V_INDEX };
/** Output rows. */
export const OUTPUT: AttentionRows = { name: "o", index: OUT_INDEX };
/** Output-gradient rows. */
export const OUTPUT_GRAD: AttentionRows = { name: "dout", index: OUT_INDEX };

/** Row statistics (log-sum-exp, δ) are f32; everything else is `stored`. */
export function attentionBindings<B extends string>(
  reads: B[],
  writes: B[],
  stored: Binding<B>["type"],
): Binding<B>[] {
  const typeOf = (name: B) => ["lse", "delta"].includes(name) ? "f32" : stored;
  return [
    ...reads.map((name) => ({ name, type: typeOf(name) })),
    ...writes.map((name) => ({ name, type: typeOf(name), write: true })),
  ];
}
