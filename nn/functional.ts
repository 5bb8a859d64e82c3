/**
 * The layer-level ops layers are built from, re-exported under `nn` so that
 * model code reads like PyTorch's `torch.nn.functional`.
 */
export { gelu, type GeluOptions, relu } from "../gpu/ops/elementwise.ts";
export { linear, type LinearOptions } from "../gpu/ops/linear.ts";
export { logSoftmax, softmax } from "../gpu/ops/softmax.ts";
export { layerNorm, type LayerNormOptions } from "../gpu/ops/layer_norm.ts";
export { batchNorm, batchNormCounter, type BatchNormOptions } from "../gpu/ops/batch_norm.ts";
export { dropout } from "../gpu/ops/dropout.ts";
export { embedding } from "../gpu/ops/embedding.ts";
export { conv2d, type Conv2dOptions } from "../gpu/ops/conv2d.ts";
export {
  adaptiveAvgPool2d,
  type AdaptiveSize2d,
  avgPool2d,
  type AvgPool2dOptions,
  maxPool2d,
  type MaxPool2dIndicesOptions,
  type MaxPool2dOptions,
} from "../gpu/ops/pool2d.ts";
export { flatten } from "../gpu/ops/flatten.ts";
export type { Size2d } from "../gpu/ops/size2d.ts";
