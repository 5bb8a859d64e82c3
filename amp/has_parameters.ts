/**
 * What the AMP trainer and its captured steps train: anything with fp32
 * parameters (a Module, or a hand-written model).
 *
 * @module
 */
import type { Tensor } from "../gpu/mod.ts";

/** A model: anything with fp32 parameters. */
export interface HasParameters {
  /** The fp32 master parameters. */
  parameters(): Tensor[];
}
