/**
 * The layer-level ops layers are built from, re-exported under `nn` so that
 * model code reads like PyTorch's `torch.nn.functional`.
 */
export { gelu, relu } from "../gpu/ops/elementwise.ts";
export { linear, type LinearOptions } from "../gpu/ops/matmul.ts";
export { logSoftmax, softmax } from "../gpu/ops/softmax.ts";
export { layerNorm, type LayerNormOptions } from "../gpu/ops/layer_norm.ts";
export { batchNorm, type BatchNormOptions } from "../gpu/ops/batch_norm.ts";
export { dropout } from "../gpu/ops/dropout.ts";
export { embedding } from "../gpu/ops/embedding.ts";
