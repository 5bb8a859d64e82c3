/**
 * Fused causal attention on register tiles: the plans of
 * gpu/kernels/attention/flash_attention.ts (a thread per row) done the way the matmul
 * does it. A workgroup owns `br` rows (queries in forward and dq, keys in
 * dk/dv) and steps over the other side `bc` rows at a time; its threads form a
 * TY × TX grid (TY = br / rm, TX = bc / rn) and each computes an rm × rn block
 * of scores in registers from tiles staged in workgroup memory: f16 and
 * bf16 widened to f32 while staging (read through the `ld_` accessors), in vec4<f32> elements where D is a multiple of 4
 * (scalars otherwise), rows padded to an odd stride in elements so that
 * threads reading different rows at one column hit different banks. The D
 * loops are unrolled by the generator (up to 8 scalar or 4 vec4 steps per
 * iteration; whole D would make D = 128 kernels too slow to compile). The
 * same thread then owns column groups tx, tx + TX, … (DN = ⌈D4 / TX⌉ of them,
 * D4 = D / 4 with vec4) of its rm rows' output or gradient accumulators.
 * Causal blocks above the diagonal are never visited (forward and dq stop at
 * the block's last row, dk/dv start at its first); the diagonal blocks are
 * masked per entry.
 *
 * - Forward: online softmax per row. Each thread writes its block's row
 *   maxima and sums into workgroup memory and reads the TX partials of its
 *   rows, so every thread of a row holds the same m and l; p·keep goes to a
 *   [br, bc] tile that the accumulate step reads with V.
 * - dq: S = Q·Kᵀ and dP = dO·Vᵀ blocks, dS = P·(dP·keep − δ) into the tile,
 *   dq += dS·K. δ = dO·O is computed once per row at the start and written.
 * - dk/dv: the workgroup's keys stay staged; for each block of queries from
 *   the diagonal on, W = P·keep and then dS go through one tile (two
 *   accumulate steps), dv += W·dO and dk += dS·Q.
 *
 * Registers per thread (named scalars and vec4s made by the generator, no
 * arrays, so nothing is indexed dynamically and nothing need spill), in
 * floats, L = 4 lanes with vec4 (else 1): forward rm·rn scores and
 * probabilities, L·rm·DN accumulators, 3·rm row statistics; dq 2·rm·rn +
 * L·rm·DN; dk/dv 4·rm·rn (s, dp, p, keep, the last two kept across a barrier)
 * + 2·L·rm·DN. The largest, {32, 32, 4, 4} at D = 64 (TX = 8, DN = 2), holds
 * 64 + 64 = 128 in dk/dv; {16, 16, 2, 2} at D = 128 (DN = 4) 16 + 64 = 80;
 * with indices and addresses, under the 255-register limit.
 *
 * Dropout uses the same counters as the row plans (entry (z, i, j) of the
 * virtual [B·H, T, T] matrix), so the mask is the same whatever the plan.
 */
import type { DType } from "../../base/dtype.ts";
import { defineKernel } from "../../device/kernel.ts";
import { WGSL_RANDOM } from "../wgsl/random.ts";
import { WGSL_GRID_BUILTINS, WGSL_WORKGROUP_INDEX } from "../wgsl/grid.ts";
import { WGSL_LOWEST } from "../wgsl/math.ts";
import {
  ATTENTION_UNIFORMS,
  attentionBindings,
  type AttentionRows,
  keepFactor,
  KEYS,
  OUTPUT,
  OUTPUT_GRAD,
  QUERIES,
  VALUES,
} from "./flash_attention_shared.ts";

/** Tiled kernel config: storage dtype, head size, the tile, dropout, packed q/k/v. */
export type TiledAttentionConfig = {
  br: number;
  bc: number;
  rm: number;
  rn: number;
  dtype: DType;
  headSize: number;
  dropout: boolean;
  packed: boolean;
};

/** A register-tiled attention plan's block sizes (see `AttentionPlan` in plans.ts). */
export interface AttentionTile {
  /** Rows per workgroup (queries in forward and dq, keys in dk/dv). */
  br: number;
  /** Rows of the other side per step. */
  bc: number;
  /** Rows of the workgroup's side per thread. */
  rm: number;
  /** Rows of the other side per thread. */
  rn: number;
}

/** The register-tiled plans the tuner tries on GPUs (those whose tiles fit the device). */
export const TILED_ATTENTION_TILES: readonly AttentionTile[] = [
  { br: 32, bc: 32, rm: 2, rn: 2 },
  { br: 32, bc: 32, rm: 4, rn: 4 },
  { br: 32, bc: 16, rm: 2, rn: 1 },
  { br: 64, bc: 16, rm: 4, rn: 1 },
  { br: 16, bc: 16, rm: 2, rn: 2 },
];

/**
 * Threads across (TX) and down (TY); lanes per tile element (vec4 where D
 * allows) and D4, the head size in elements; DN, the column groups (of
 * `lanes`) per thread; DP, a tile row's stride in elements: odd, so threads
 * reading different rows at one column hit different banks.
 */
function layout(t: AttentionTile, headSize: number) {
  const tx = t.bc / t.rn, ty = t.br / t.rm;
  const lanes = headSize % 4 === 0 ? 4 : 1, d4 = headSize / lanes;
  const dn = Math.ceil(d4 / tx);
  return { tx, ty, threads: tx * ty, lanes, d4, dn, dp: d4 % 2 === 0 ? d4 + 1 : d4 + 2 };
}

/**
 * Bytes of workgroup memory the largest of the three kernels declares: the
 * dq and dk/dv passes stage two [br, D] and two [bc, D] tiles, one [br, bc]
 * tile and two f32 per row.
 */
export function tiledAttentionBytes(t: AttentionTile, headSize: number): number {
  const { tx, lanes, dp } = layout(t, headSize), row = dp * lanes;
  const forward = (t.br + t.bc) * row + t.br * t.bc + 2 * t.br * tx;
  const backward = 2 * (t.br + t.bc) * row + t.br * t.bc + 2 * Math.max(t.br, t.bc);
  return 4 * Math.max(forward, backward);
}

/** Loop iterations of one invocation (lavapipe caps them; see loop_limit.ts), generously. */
export function tiledAttentionIterations(t: AttentionTile, headSize: number, seq: number): number {
  const { threads, tx } = layout(t, headSize);
  const steps = Math.ceil(seq / t.bc);
  const staging = Math.ceil(2 * t.bc * headSize / threads) + 2;
  return 2 * Math.ceil(t.br * headSize / threads) + t.br + headSize +
    steps * (2 * staging + 2 * headSize + 2 * t.rm * tx + 2 * t.bc + 8);
}

const range = (n: number) => [...Array(n).keys()];

/** The score loop's unroll: the largest of 8, 4, 2, 1 dividing D4 (at most 4 vec4 steps). */
const unrollOf = (d4: number, lanes: number) =>
  [8, 4, 2, 1].find((u) => d4 % u === 0 && u * lanes <= 16)!;

/** The tiled kernels bind scalars of the dtype (their staging loads are coalesced anyway). */
function tiledBindings<B extends string>(reads: B[], writes: B[], c: TiledAttentionConfig) {
  return attentionBindings(reads, writes, c.dtype);
}

/** Row a of this thread's rows (in its workgroup's block) and column b of the other side's. */
const ROW = (a: number) => `(ty + ${a}u * TY)`;
const COL = (b: number) => `(tx + ${b}u * TX)`;

/**
 * Kernel header: constants, the workgroup tiles (arrays of V, the f32 tile
 * element, for a size given in rows × DP; of f32 otherwise), prelude.
 */
function header(c: TiledAttentionConfig, tiles: Record<string, string>): string {
  const { tx, ty, threads, dn, dp, lanes, d4 } = layout(c, c.headSize);
  const declared = Object.entries(tiles).map(([name, size]) =>
    `var<workgroup> ${name}: array<${size.includes("DP") ? "V" : "f32"}, ${size}>;`
  );
  return `${c.dropout ? WGSL_RANDOM : ""}
alias V = ${lanes === 4 ? "vec4<f32>" : "f32"};
fn dotv(a: V, b: V) -> f32 { return ${lanes === 4 ? "dot(a, b)" : "a * b"}; }
const D = ${c.headSize}u;
const D4 = ${d4}u;
const DP = ${dp}u;
const DN = ${dn}u;
const TX = ${tx}u;
const TY = ${ty}u;
const NT = ${threads}u;
const BR = ${c.br}u;
const BC = ${c.bc}u;
${declared.join("\n")}
@compute @workgroup_size(${threads})
fn main(${WGSL_GRID_BUILTINS}) {
  let block = ${WGSL_WORKGROUP_INDEX} % p.blocks;
  let z = ${WGSL_WORKGROUP_INDEX} / p.blocks;
  if (z >= p.bh) { return; }
  let tx = lid % TX;
  let ty = lid / TX;
  let width = p.heads * D;
  let head0 = (z / p.heads) * p.t * width + (z % p.heads) * D;
  let in0 = (z / p.heads) * p.t * p.inWidth + (z % p.heads) * D;
  let r0 = block * BR;`;
}

/** WGSL: tile element e (a V) of storage row `row`, read through the accessor (widened to f32). */
function loadV(c: TiledAttentionConfig, from: AttentionRows, row: string) {
  const at = (e: string) => `ld_${from.name}(${from.index(row, e)})`;
  if (layout(c, c.headSize).lanes === 1) return at("e");
  return `V(${range(4).map((l) => at(`e * 4u + ${l}u`)).join(", ")})`;
}

/**
 * Copies `count` rows from row `first` of each source into its tile (as f32,
 * times `factor`; zeros past row T), then waits for the workgroup.
 */
function stage(
  c: TiledAttentionConfig,
  count: string,
  first: string,
  tiles: Record<string, { from: AttentionRows; factor?: string }>,
): string {
  const copies = Object.entries(tiles).map(([tile, { from, factor }]) =>
    `${tile}[row * DP + e] = select(V(0.0), ${loadV(c, from, "min(g, p.t - 1u)")}${
      factor ? ` * ${factor}` : ""
    }, g < p.t);`
  );
  return `for (var x = lid; x < ${count} * D4; x += NT) {
    let row = x / D4;
    let e = x % D4;
    let g = ${first} + row;
    ${copies.join("\n    ")}
  }
  workgroupBarrier();`;
}

/**
 * Declares `${out}_a_b` (a < rm, b < rn) and sums into it the products of
 * rows ROW(a) of tile `left` and rows COL(b) of tile `right` over D, the
 * loop unrolled by the generator.
 */
function dotBlock(c: TiledAttentionConfig, out: string, left: string, right: string): string {
  const { d4, lanes } = layout(c, c.headSize), unroll = unrollOf(d4, lanes);
  const decl = range(c.rm).flatMap((a) => range(c.rn).map((b) => `var ${out}_${a}_${b} = 0.0;`));
  const steps = range(unroll).map((u) => {
    const l = range(c.rm).map((a) => `let l${a} = ${left}[${ROW(a)} * DP + e + ${u}u];`);
    const r = range(c.rn).map((b) => `let r${b} = ${right}[${COL(b)} * DP + e + ${u}u];`);
    const fma = range(c.rm).flatMap((a) =>
      range(c.rn).map((b) => `${out}_${a}_${b} += dotv(l${a}, r${b});`)
    );
    return `{ ${[...l, ...r, ...fma].join(" ")} }`;
  });
  return `${decl.join(" ")}
  for (var e = 0u; e < D4; e += ${unroll}u) {
    ${steps.join("\n    ")}
  }`;
}

/** Declares the accumulators `${acc}_a_n` (a < rm, n < DN; V each: column group tx + n·TX), zero. */
function declareAcc(c: TiledAttentionConfig, acc: string): string {
  const { dn } = layout(c, c.headSize);
  return range(c.rm).flatMap((a) => range(dn).map((n) => `var ${acc}_${a}_${n} = V(0.0);`)).join(
    " ",
  );
}

/**
 * `${acc}_a_n` += Σ_j weights[ROW(a), j] · values[j, group n] over the bc
 * rows of the step (groups past D4 read the last one: their sums are never stored).
 */
function accumulate(c: TiledAttentionConfig, acc: string, weights: string, values: string): string {
  const { dn, tx, d4 } = layout(c, c.headSize);
  const group = (n: number) => dn * tx > d4 ? `min(tx + ${n}u * TX, D4 - 1u)` : `tx + ${n}u * TX`;
  const w = range(c.rm).map((a) => `let w${a} = V(${weights}[${ROW(a)} * BC + j]);`);
  const v = range(dn).map((n) => `let v${n} = ${values}[j * DP + ${group(n)}];`);
  const fma = range(c.rm).flatMap((a) =>
    range(dn).map((n) => `${acc}_${a}_${n} = fma(w${a}, v${n}, ${acc}_${a}_${n});`)
  );
  return `for (var j = 0u; j < BC; j++) {
    ${[...w, ...v, ...fma].join(" ")}
  }`;
}

/**
 * Stores `${acc}_a_n` · factor into binding `name` at `index(row, col)` for
 * real rows and columns. With vec4 lanes a group's first element is at an
 * even index (every offset is a multiple of D, itself one of 4), so each
 * pair is one whole word of a bf16 binding: `st2_`, no atomics.
 */
function store(
  c: TiledAttentionConfig,
  acc: string,
  to: AttentionRows,
  factor: (a: number) => string,
): string {
  const { dn, lanes } = layout(c, c.headSize);
  return range(c.rm).map((a) => {
    const cols = range(dn).map((n) => {
      const g = `tx + ${n}u * TX`, value = `${acc}_${a}_${n} * ${factor(a)}`;
      const stores = lanes === 1
        ? `st_${to.name}(${to.index("row", g)}, ${value});`
        : `let x = ${value}; let w = (${to.index("row", `(${g}) * 4u`)}) / 2u; ` +
          `st2_${to.name}(w, x.xy); st2_${to.name}(w + 1u, x.zw);`;
      return `if (${g} < D4) { ${stores} }`;
    });
    return `{ let row = r0 + ${ROW(a)}; if (row < p.t) { ${cols.join(" ")} } }`;
  }).join("\n  ");
}

/** Every (a, b) pair of a thread's block. */
function eachEntry(c: TiledAttentionConfig, f: (a: number, b: number) => string): string {
  return range(c.rm).flatMap((a) => range(c.rn).map((b) => f(a, b))).join("\n    ");
}

/** Forward: o and the log-sum-exp of each query row. */
export const tiledAttentionForwardKernel = defineKernel({
  name: "flash_attention_tiled_forward",
  bindings: (c: TiledAttentionConfig) => tiledBindings(["q", "k", "v"], ["o", "lse"], c),
  uniforms: ATTENTION_UNIFORMS,
  source: (c) => {
    const rows = range(c.rm);
    return `${
      header(c, {
        qt: "BR * DP",
        kvt: "BC * DP",
        pt: "BR * BC",
        maxes: "BR * TX",
        sums: "BR * TX",
      })
    }
  ${stage(c, "BR", "r0", { qt: { from: QUERIES, factor: "p.scale" } })}
  ${rows.map((a) => `var m${a} = ${WGSL_LOWEST}; var l${a} = 0.0;`).join(" ")}
  ${declareAcc(c, "acc")}
  // Keys past the block's last row are masked for all its rows: stop there.
  let keysEnd = min(r0 + BR, p.t);
  for (var k0 = 0u; k0 < keysEnd; k0 += BC) {
    ${stage(c, "BC", "k0", { kvt: { from: KEYS } })}
    ${dotBlock(c, "s", "qt", "kvt")}
    ${
      eachEntry(c, (a, b) =>
        `let valid_${a}_${b} = k0 + ${COL(b)} <= r0 + ${ROW(a)} && k0 + ${COL(b)} < p.t;`)
    }
    ${
      rows.map((a) =>
        `maxes[${ROW(a)} * TX + tx] = max(${
          range(c.rn).map((b) => `select(${WGSL_LOWEST}, s_${a}_${b}, valid_${a}_${b})`)
            .reduce((x, y) => `max(${x}, ${y})`)
        }, ${WGSL_LOWEST});`
      ).join("\n    ")
    }
    workgroupBarrier();
    ${
      rows.map((a) =>
        `var blockMax${a} = m${a};
    for (var t = 0u; t < TX; t++) { blockMax${a} = max(blockMax${a}, maxes[${ROW(a)} * TX + t]); }
    let rescale${a} = exp(m${a} - blockMax${a});
    m${a} = blockMax${a};`
      ).join("\n    ")
    }
    ${
      eachEntry(c, (a, b) =>
        `let p_${a}_${b} = select(0.0, exp(s_${a}_${b} - m${a}), valid_${a}_${b});
    pt[${ROW(a)} * BC + ${COL(b)}] = p_${a}_${b} * ${
          keepFactor(c.dropout, `r0 + ${ROW(a)}`, `k0 + ${COL(b)}`)
        };`)
    }
    ${
      rows.map((a) =>
        `sums[${ROW(a)} * TX + tx] = ${range(c.rn).map((b) => `p_${a}_${b}`).join(" + ")};`
      ).join("\n    ")
    }
    // Every thread is past its K reads (the barrier above): V takes the tile.
    ${stage(c, "BC", "k0", { kvt: { from: VALUES } })}
    ${
      rows.map((a) => {
        const scaled = range(layout(c, c.headSize).dn).map((n) => `acc_${a}_${n} *= rescale${a};`);
        return `l${a} *= rescale${a};
    for (var t = 0u; t < TX; t++) { l${a} += sums[${ROW(a)} * TX + t]; }
    ${scaled.join(" ")}`;
      }).join("\n    ")
    }
    ${accumulate(c, "acc", "pt", "kvt")}
    workgroupBarrier();
  }
  ${store(c, "acc", OUTPUT, (a) => `(1.0 / l${a})`)}
  if (tx == 0u) {
    ${
      rows.map((a) =>
        `if (r0 + ${ROW(a)} < p.t) { lse[z * p.t + r0 + ${ROW(a)}] = m${a} + log(l${a}); }`
      ).join("\n    ")
    }
  }
}`;
  },
});

/** Backward, per query block: dq and δ = dO·O. */
export const tiledAttentionDqKernel = defineKernel({
  name: "flash_attention_tiled_dq",
  bindings: (c: TiledAttentionConfig) =>
    tiledBindings(["q", "k", "v", "o", "dout", "lse"], ["dq", "delta"], c),
  uniforms: ATTENTION_UNIFORMS,
  source: (c) =>
    `${
      header(c, {
        qt: "BR * DP",
        gt: "BR * DP",
        kt: "BC * DP",
        vt: "BC * DP",
        dst: "BR * BC",
        lt: "BR",
        dt: "BR",
      })
    }
  ${stage(c, "BR", "r0", { qt: { from: QUERIES, factor: "p.scale" }, gt: { from: OUTPUT_GRAD } })}
  for (var row = lid; row < BR; row += NT) {
    let i = r0 + row;
    var d = 0.0;
    var li = 0.0;
    if (i < p.t) {
      for (var e = 0u; e < D4; e++) {
        d += dotv(gt[row * DP + e], ${loadV(c, OUTPUT, "i")});
      }
      delta[z * p.t + i] = d;
      li = lse[z * p.t + i];
    }
    dt[row] = d;
    lt[row] = li;
  }
  ${declareAcc(c, "acc")}
  let keysEnd = min(r0 + BR, p.t);
  for (var k0 = 0u; k0 < keysEnd; k0 += BC) {
    ${stage(c, "BC", "k0", { kt: { from: KEYS }, vt: { from: VALUES } })}
    ${dotBlock(c, "s", "qt", "kt")}
    ${dotBlock(c, "dp", "gt", "vt")}
    ${
      eachEntry(c, (a, b) => {
        const i = `r0 + ${ROW(a)}`, j = `k0 + ${COL(b)}`;
        return `dst[${ROW(a)} * BC + ${COL(b)}] = select(0.0, exp(s_${a}_${b} - lt[${
          ROW(a)
        }]) * (dp_${a}_${b} * ${keepFactor(c.dropout, i, j)} - dt[${
          ROW(a)
        }]), ${j} <= ${i} && ${j} < p.t);`;
      })
    }
    workgroupBarrier();
    ${accumulate(c, "acc", "dst", "kt")}
    workgroupBarrier();
  }
  ${store(c, "acc", { ...QUERIES, name: "dq" }, () => "p.scale")}
}`,
});

/** Backward, per key block: dk and dv (after {@link tiledAttentionDqKernel} wrote δ). */
export const tiledAttentionDkvKernel = defineKernel({
  name: "flash_attention_tiled_dkv",
  bindings: (c: TiledAttentionConfig) =>
    tiledBindings(
      ["q", "k", "v", "dout", "lse", "delta"],
      // WebGPU forbids two writable bindings of one buffer: packed gradients go through one.
      c.packed ? ["dkv"] : ["dk", "dv"],
      c,
    ),
  uniforms: ATTENTION_UNIFORMS,
  source: (c) =>
    `${
      header(c, {
        kt: "BR * DP",
        vt: "BR * DP",
        qt: "BC * DP",
        gt: "BC * DP",
        wt: "BR * BC",
        lt: "BC",
        dt: "BC",
      })
    }
  ${stage(c, "BR", "r0", { kt: { from: KEYS, factor: "p.scale" }, vt: { from: VALUES } })}
  ${declareAcc(c, "dk")}
  ${declareAcc(c, "dv")}
  // Queries before the block's first key see none of its keys.
  for (var q0 = r0; q0 < p.t; q0 += BC) {
    for (var row = lid; row < BC; row += NT) {
      let i = min(q0 + row, p.t - 1u);
      lt[row] = lse[z * p.t + i];
      dt[row] = delta[z * p.t + i];
    }
    ${stage(c, "BC", "q0", { qt: { from: QUERIES }, gt: { from: OUTPUT_GRAD } })}
    ${dotBlock(c, "s", "kt", "qt")}
    ${dotBlock(c, "dp", "vt", "gt")}
    ${
      eachEntry(c, (a, b) => {
        const j = `r0 + ${ROW(a)}`, i = `q0 + ${COL(b)}`;
        return `let valid_${a}_${b} = ${i} >= ${j} && ${i} < p.t;
    let p_${a}_${b} = select(0.0, exp(s_${a}_${b} - lt[${COL(b)}]), valid_${a}_${b});
    let keep_${a}_${b} = ${keepFactor(c.dropout, i, j)};
    wt[${ROW(a)} * BC + ${COL(b)}] = p_${a}_${b} * keep_${a}_${b};`;
      })
    }
    workgroupBarrier();
    ${accumulate(c, "dv", "wt", "gt")}
    workgroupBarrier();
    // Selected, not multiplied by a zero p: a query the key cannot see may have a NaN δ.
    ${
      eachEntry(c, (a, b) =>
        `wt[${ROW(a)} * BC + ${
          COL(b)
        }] = select(0.0, p_${a}_${b} * (dp_${a}_${b} * keep_${a}_${b} - dt[${
          COL(b)
        }]), valid_${a}_${b});`)
    }
    workgroupBarrier();
    ${accumulate(c, "dk", "wt", "qt")}
    workgroupBarrier();
  }
  ${store(c, "dk", { ...KEYS, name: c.packed ? "dkv" : "dk" }, () => "p.scale")}
  ${store(c, "dv", { ...VALUES, name: c.packed ? "dkv" : "dv" }, () => "1.0")}
}`,
});
