/**
 * The edge sweep of a matmul tiling: the shapes around its workgroup tile
 * that each run one bound check, for every tiling kind (the CPU and GPU
 * tilings in tests/gpu/kernels/matmul_tilings_test.ts, the subgroup-matrix ones in
 * tests/gpu/kernels/matmul_subgroup_matrix_test.ts).
 */
import type { MatmulTiling } from "../../gpu/mod.ts";

/** A batched product's sizes. */
export interface EdgeProduct {
  batch: number;
  m: number;
  n: number;
  k: number;
}

/**
 * Shapes around `tiling`'s workgroup tile (bm × bn, k-step tk), each with
 * the guard it exercises. One dimension past a tile at a time (by 4, so
 * vec4 alignment stays and only that bound check differs), then all three
 * (odd: misaligned strides too), then a tall and a wide product: with
 * square shapes a kernel that swaps m and n in its grid or bounds passes.
 * Two batches: a store past row m of batch 0 lands in batch 1 (past the end
 * of the only batch, lavapipe drops it and nothing shows).
 */
export function edgeShapes(tiling: MatmulTiling): { dims: EdgeProduct; guard: string }[] {
  const bm = tiling.tm * tiling.wgy, bn = tiling.tn * tiling.wgx, k = 2 * Math.max(tiling.tk, 8);
  const shapes: { dims: Omit<EdgeProduct, "batch">; guard: string }[] = [
    { dims: { m: bm + 4, n: bn, k }, guard: "rows past m: A loads and C stores" },
    { dims: { m: bm, n: bn + 4, k }, guard: "columns past n: B loads and C stores" },
    { dims: { m: bm, n: bn, k: k + 4 }, guard: "a partial last k-step: zero fill" },
    { dims: { m: bm + 1, n: bn + 3, k: k + 1 }, guard: "all three, misaligned" },
    { dims: { m: 2 * bm + 4, n: 12, k }, guard: "m > n: the grid's rows" },
    { dims: { m: 12, n: 2 * bn + 4, k }, guard: "n > m: the grid's columns" },
  ];
  return shapes.map(({ dims, guard }) => ({ dims: { batch: 2, ...dims }, guard }));
}
