/**
 * Neural-network building blocks: the `Module` base with named parameters,
 * buffers and state dicts; layers (Linear, activations, Dropout, Embedding,
 * Sequential); losses; plain SGD; and the functional layer ops.
 *
 * @module
 */
export * from "./functional.ts";
export { type HostTensor, Module, type StateValue } from "./module.ts";
export { type InitSource, type ParameterOptions } from "./init.ts";
export { Linear, type LinearLayerOptions } from "./linear.ts";
export { GELU, ReLU } from "./activation.ts";
export { Dropout } from "./dropout.ts";
export { Embedding } from "./embedding.ts";
export { Sequential } from "./sequential.ts";
export { crossEntropy, type CrossEntropyOptions, mseLoss, type Reduction } from "./losses.ts";
export { SGD } from "./sgd.ts";
