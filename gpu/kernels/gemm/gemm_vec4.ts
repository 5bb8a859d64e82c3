/**
 * The `vec4` GEMM tiling: the kernel structure of the fastest GPU SGEMM
 * probe through Deno's WebGPU, with edges and the matmul's strides,
 * batches, split-K and epilogues added:
 * - global loads are vec4 along each operand's contiguous index, so they stay
 *   coalesced in every orientation; an operand whose rows run along k is
 *   transposed while it is stored (4 scalar stores into a k-row padded by one
 *   vec4 against bank conflicts);
 * - the next k-tile is loaded into registers while the current one is
 *   multiplied, with one workgroup-memory stage (two did not pay);
 * - workgroup tiles are `[k][i]` arrays of vec4<f32>, read with constant
 *   outer indices in the fully unrolled inner loop (wgpu clamps non-constant
 *   workgroup indices: these clamps stay loop-invariant);
 * - f16 operands are widened to f32 while staged (converting in the inner
 *   loop was slower); under `f16Accumulation: "chunked"` the
 *   tiles stay f16 and the chunks are summed in f16, as in `blocked`. bf16
 *   operands (bound as `vec4<bf16>`: a vec4 load is two u32 words) are
 *   widened the same way, always into f32 tiles;
 * - each workgroup decides outside the k loop whether its tile is interior
 *   (whole in m and n, operands vec4-aligned): interior tiles load vec4s
 *   without checks except on a last, partial k-tile; edge tiles load scalars
 *   with bounds checks. The inner loop never checks bounds;
 * - interior tiles store vec4s with the bias (loaded once per column group)
 *   and activation fused (a bf16 result: two whole words); edge tiles store
 *   checked scalars (bf16: one half of a word, see `st_` in gpu/device/kernel.ts).
 * Needs `GemmIo.vector` (matmul); other GEMMs get the blocked kernel.
 */
import type { MatmulTiling } from "./settings.ts";
import {
  accAt,
  blockedWgsl,
  sliceMath,
  threadCol,
  threadRow,
  type TileRead,
} from "./gemm_blocked.ts";
import { epilogue, type GemmIo, range, workgroupTileMain } from "./gemm_io.ts";
import { type Activation, activationExpr, WGSL_MATH } from "../wgsl/math.ts";

/** Workgroup tile shape of a tiling: rows, columns, k-step, threads. */
function blockOf(t: MatmulTiling) {
  return { bm: t.tm * t.wgy, bn: t.tn * t.wgx, tk: t.tk, threads: t.wgx * t.wgy };
}

/** Vec4s per k-row of an operand's tile: padded by one when stored transposed (rows along k). */
function rowVec4s(extent: number, alongK: boolean): number {
  return extent / 4 + (alongK ? 1 : 0);
}

/**
 * Bytes of workgroup memory the vec4 tiling uses with tiles of `tileType`
 * (f16 only under chunked f16 accumulation), at the worst orientation.
 */
export function vec4TileBytes(t: MatmulTiling, tileType: "f32" | "f16"): number {
  const { bm, bn, tk } = blockOf(t);
  return tk * (rowVec4s(bm, true) + rowVec4s(bn, true)) * (tileType === "f16" ? 8 : 16);
}

/** Why the vec4 kernel cannot be built with `t`, or null. */
export function vec4ShapeProblem(t: MatmulTiling): string | null {
  if (t.tm % 4 !== 0 || t.tn % 4 !== 0 || t.tk % 4 !== 0) {
    return `the vec4 variant needs tm, tn and tk multiples of 4, not ${t.tm}, ${t.tn} and ${t.tk}`;
  }
  return null;
}

/** How one operand's tile is loaded: the WGSL pieces of a loader. */
interface OperandLoader {
  /** Loop-invariant indices of each thread's loads. */
  prelude: string[];
  /** Register declarations. */
  registers: string[];
  /** Statements filling the registers from the k-tile at k0 with vec4 loads (interior). */
  vectorLoads: string[];
  /** The same with bounds-checked scalar loads (edges, zeros outside). */
  scalarLoads: string[];
  /** Statements storing the registers into the workgroup tile. */
  stores: string[];
}

/**
 * The loader of operand `op` ("a": extent along rows, "b": along columns).
 * Each thread owns `ceil(units / threads)` vec4 units of the tile, indices
 * computed once. `alongK`: the operand's contiguous index is k.
 */
function operandLoader(opts: {
  op: "a" | "b";
  extent: number;
  tk: number;
  threads: number;
  alongK: boolean;
  origin: string;
  limit: string;
  kCount: string;
  tileType: "f32" | "f16";
  vec: (outer: string, k: string) => string;
  at: (outer: string, k: string) => string;
}): OperandLoader {
  const { op, extent, tk, threads, alongK, origin, limit, kCount, tileType } = opts;
  // Units of the tile: alongK, (outer d, k-quad q) with q fastest; else (k, outer-quad q), q fastest.
  const fastest = alongK ? tk / 4 : extent / 4;
  const units = extent * tk / 4;
  const loads = Math.ceil(units / threads);
  const out: OperandLoader = {
    prelude: [],
    registers: [],
    vectorLoads: [],
    scalarLoads: [],
    stores: [],
  };
  for (const r of range(loads)) {
    const reg = `r${op}${r}`, s = `${op}${r}`;
    const guarded = (lines: string[]) =>
      (r + 1) * threads > units
        ? [`if (t + ${r * threads}u < ${units}u) { ${lines.join(" ")} }`]
        : lines;
    out.prelude.push(
      `let ${s}_slow = (t + ${r * threads}u) / ${fastest}u; let ${s}_fast = (t + ${
        r * threads
      }u) % ${fastest}u;`,
    );
    out.registers.push(`var ${reg} = vec4<f32>();`);
    // (outer, k) of the unit's first element; the other three follow along the contiguous index.
    const [outer, k] = alongK
      ? [`(${origin} + ${s}_slow)`, `(k0 + ${s}_fast * 4u)`]
      : [`(${origin} + ${s}_fast * 4u)`, `(k0 + ${s}_slow)`];
    out.vectorLoads.push(...guarded([`${reg} = ${opts.vec(outer, k)};`]));
    const checked = range(4).map((c) => {
      const [o, kk] = alongK ? [outer, `(${k} + ${c}u)`] : [`(${outer} + ${c}u)`, k];
      return `if (${o} < ${limit} && ${kk} < ${kCount}) { ${reg}[${c}] = ${opts.at(o, kk)}; }`;
    });
    out.scalarLoads.push(...guarded([`${reg} = vec4<f32>();`, ...checked]));
    const tile = `tile_${op}`;
    const stores = alongK
      ? range(4).map((c) =>
        `${tile}[${s}_fast * 4u + ${c}u][${s}_slow / 4u][${s}_slow % 4u] = ${tileType}(${reg}[${c}]);`
      )
      : [`${tile}[${s}_slow][${s}_fast] = vec4<${tileType}>(${reg});`];
    out.stores.push(...guarded(stores));
  }
  return out;
}

/** `activation` applied to each lane of the vec4<f32> named `v`. */
export function activationVec4(activation: Activation, v: string): string {
  if (activation === "none") return v;
  return `vec4<f32>(${range(4).map((c) => activationExpr(activation, `${v}[${c}]`)).join(", ")})`;
}

/** The WGSL body of a GEMM kernel with the vec4 tiling `t`. */
export function vec4Wgsl(t: MatmulTiling, io: GemmIo, activation: Activation): string {
  const vector = io.vector;
  if (!vector) return blockedWgsl(t, io, activation);
  const problem = vec4ShapeProblem(t);
  if (problem) throw new Error(`vec4Wgsl: ${problem}`);
  const { bm, bn, tk, threads } = blockOf(t);
  const chunk = io.f16Chunk ?? 0;
  const tileType = chunk > 0 ? "f16" : "f32";
  const kCount = io.kCount ?? "p.k";
  const aAlongK = (io.aAlong ?? "k") === "k", bAlongK = io.bAlong === "k";
  const shared = { tk, threads, kCount, tileType } as const;
  const a = operandLoader({
    ...shared,
    op: "a",
    extent: bm,
    alongK: aAlongK,
    origin: "tile_row",
    limit: "p.m",
    vec: vector.aVec,
    at: io.aAt,
  });
  const b = operandLoader({
    ...shared,
    op: "b",
    extent: bn,
    alongK: bAlongK,
    origin: "tile_col",
    limit: "p.n",
    vec: (col, k) => vector.bVec(k, col),
    at: (col, k) => io.bAt(k, col),
  });
  const read: TileRead = (tile, kk, group) => `tile_${tile}[${kk}][${group}]`;
  const gn = t.tn / 4;
  const biasVecs = vector.biasVec
    ? range(gn).map((h) => `let bias${h} = ${vector.biasVec!(`(${threadCol(t, 4 * h)})`)};`)
    : [];
  const vectorStores = range(t.tm).flatMap((i) =>
    range(gn).map((h) => {
      const sum = vector.biasVec ? `acc[${i * gn + h}] + bias${h}` : `acc[${i * gn + h}]`;
      const [row, col] = [`(${threadRow(t, i)})`, `(${threadCol(t, 4 * h)})`];
      const store = vector.storeVec(row, col, activationVec4(activation, "s"));
      return `{ let s = ${sum}; ${store} }`;
    })
  );
  const scalarEpilogue = epilogue(
    t,
    io,
    activation,
    (i) => threadRow(t, i),
    (j) => threadCol(t, j),
    (i, j) => accAt(t, i, j),
  );
  const join = (lines: string[], indent: string) => lines.join(`\n${indent}`);
  return `${WGSL_MATH}${io.prelude ?? ""}
var<workgroup> tile_a: array<array<vec4<${tileType}>, ${rowVec4s(bm, aAlongK)}>, ${tk}>;
var<workgroup> tile_b: array<array<vec4<${tileType}>, ${rowVec4s(bn, bAlongK)}>, ${tk}>;
${workgroupTileMain(t, io)}
  // Interior: the whole tile in range and the operands vec4-aligned (uniform per workgroup).
  let whole = tile_row + ${bm}u <= p.m && tile_col + ${bn}u <= p.n;
  let k_tiles = (${kCount} + ${tk - 1}u) / ${tk}u;
  let vector_tiles = select(0u, ${kCount} / ${tk}u, whole && ${vector.aligned});
  ${join([...a.prelude, ...b.prelude], "  ")}
  ${join([...a.registers, ...b.registers], "  ")}
  var acc: array<vec4<f32>, ${t.tm * gn}>;
  var k0 = 0u;
  if (vector_tiles > 0u) {
    ${join([...a.vectorLoads, ...b.vectorLoads], "    ")}
  } else {
    ${join([...a.scalarLoads, ...b.scalarLoads], "    ")}
  }
  for (var kt = 0u; kt < k_tiles; kt++) {
    ${join([...a.stores, ...b.stores], "    ")}
    workgroupBarrier();
    k0 = (kt + 1u) * ${tk}u;
    if (kt + 1u < vector_tiles) {
      ${join([...a.vectorLoads, ...b.vectorLoads], "      ")}
    } else if (kt + 1u < k_tiles) {
      ${join([...a.scalarLoads, ...b.scalarLoads], "      ")}
    }
    ${sliceMath(t, read, chunk)}
    workgroupBarrier();
  }
  if (whole && ${vector.storeAligned}) {
    ${join(biasVecs, "    ")}
    ${join(vectorStores, "    ")}
  } else {
    ${scalarEpilogue}
  }
}`;
}
