/**
 * Neural-network building blocks: the `Module` base with named parameters,
 * buffers and state dicts; layers (Linear, activations, Dropout, Embedding,
 * Conv2d, pooling, Flatten, LayerNorm, BatchNorm in fp32, Sequential, Checkpointed); gradient
 * checkpointing of layer sequences; losses; and the safetensors format. The
 * functional ops layers are built from (`relu`, `linear`, `conv2d`, ...) are
 * the root module's, as `torch.nn.functional`'s are torch's. Reading and
 * writing files lives apart, in `files.ts` (the `./files` export), so this
 * module runs in browsers too. Optimizers are in `optim/`.
 *
 * @module
 */
export {
  type HostTensor,
  type LoadStateOptions,
  Module,
  nonFiniteCount,
  type StateValue,
} from "./module.ts";
export { type InitSource, type ParameterOptions } from "./init.ts";
export { Linear, type LinearLayerOptions } from "./linear.ts";
export { GELU, ReLU } from "./activation.ts";
export { Dropout } from "./dropout.ts";
export { Embedding } from "./embedding.ts";
export { Conv2d, type Conv2dLayerOptions } from "./conv.ts";
export { AdaptiveAvgPool2d, AvgPool2d, Flatten, MaxPool2d } from "./pooling.ts";
export { Sequential } from "./sequential.ts";
export {
  activationBytes,
  Checkpointed,
  type CheckpointPlan,
  checkpointSequential,
  planCheckpointSegments,
  runCheckpointed,
  type SegmentSpec,
} from "./checkpoint.ts";
export {
  BatchNorm,
  BatchNorm1d,
  BatchNorm2d,
  type BatchNormLayerOptions,
  LayerNorm,
  type LayerNormLayerOptions,
} from "./normalization.ts";
export {
  decodeSafetensors,
  type EncodeOptions,
  encodeSafetensors,
  encodeSafetensorsHeader,
  entryToTensor,
  type SafetensorsEntry,
  SafetensorsError,
  type SafetensorsSpec,
  tensorToEntry,
} from "./safetensors.ts";
export {
  crossEntropy,
  type CrossEntropyOptions,
  linearCrossEntropy,
  type LinearCrossEntropyLossOptions,
  mseLoss,
  type Reduction,
} from "./losses.ts";
export {
  causalAttention,
  type CausalAttentionOptions,
  CausalSelfAttention,
  type CausalSelfAttentionOptions,
} from "./attention.ts";
export { TransformerBlock, type TransformerBlockOptions } from "./transformer_block.ts";
