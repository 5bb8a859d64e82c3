import { DeviceArray, initGpu } from "./gpu/mod.ts";
import {
  matrixAttentionDkvKernel,
  matrixAttentionDqKernel,
  matrixBackwardsFor,
} from "./gpu/kernels/attention/flash_attention_subgroup_matrix_backward.ts";
import { grid1d } from "./gpu/kernels/wgsl/grid.ts";
const gpu = await initGpu({ matmulTiling: "default" });
const D = Number(Deno.args[0]), T = Number(Deno.args[1]), which = Deno.args[2], H = 2;
const m = matrixBackwardsFor(gpu, D, "f16")[0];
const c = H * D, br = m.subgroups * m.sm, blocks = Math.ceil(T / br);
const mk = (n: number, dt: "f16" | "f32" = "f16") => DeviceArray.filled([n], 0.1, dt, gpu);
const q = mk(T * c),
  k = mk(T * c),
  v = mk(T * c),
  o = mk(T * c),
  dout = mk(T * c),
  lse = mk(H * T, "f32"),
  delta = mk(H * T, "f32");
const dq = mk(T * c), dk = mk(T * c), dv = mk(T * c);
const u = {
  t: T,
  heads: H,
  blocks,
  bh: H,
  scale: 0.1,
  p: 0,
  keepScale: 1,
  key: 0,
  counter: 0,
  inWidth: c / 4,
  qOff: 0,
  kOff: 0,
  vOff: 0,
};
const cfg = { ...m, headSize: D, dropout: false, packed: false };
if (which === "dq") {
  gpu.dispatch(
    gpu.kernel(matrixAttentionDqKernel, cfg),
    { q, k, v, o, dout, lse, dq, delta },
    u,
    grid1d(blocks * H),
  );
} else {gpu.dispatch(
    gpu.kernel(matrixAttentionDkvKernel, cfg),
    { q, k, v, dout, lse, delta, dk, dv },
    u,
    grid1d(blocks * H),
  );}
await gpu.sync();
console.log(which, "ran", Array.from(await (which === "dq" ? dq : dk).read()).slice(0, 4));
