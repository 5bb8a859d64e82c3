/**
 * halfstep: mixed-precision neural-network training on the GPU through
 * WebGPU, for Deno and the web: f16 kernels with f32 accumulation, an
 * autograd tape, fp32 master weights, dynamic and static loss scaling,
 * gradient accumulation and clipping, fused optimizers, gradient
 * checkpointing, layers, losses and state dicts. Everything here uses Web
 * APIs only, so it loads from any URL and in browsers; file helpers are in
 * the `./files` export.
 *
 * @example
 * ```ts
 * import { initGpu, matmul, sum, Tensor } from "./mod.ts";
 * const gpu = await initGpu();
 * const a = Tensor.from([1, 2, 3, 4], [2, 2], { requiresGrad: true });
 * const loss = sum(matmul(a, a));
 * loss.backward();
 * console.log(await a.grad!.read());
 * gpu.destroy(); // frees every buffer and the device
 * ```
 *
 * @module
 */
export * from "./gpu/mod.ts";
export * from "./amp/mod.ts";
export * from "./nn/mod.ts";
