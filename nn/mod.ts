/**
 * Neural-network building blocks. Today: the functional layer ops (fused
 * linear with bias and ReLU epilogue, activations, softmax); modules,
 * losses, optimizers and state dicts build on them.
 *
 * @module
 */
export * from "./functional.ts";
