/**
 * The random generators a model's modules hold (Dropout's masks, attention
 * dropout), found by walking the module tree, so a training state can save
 * and restore where each stream stands: without them a resumed run would
 * draw the first masks again. A generator shared by several modules (one
 * `RandomGenerator` passed to every layer) is one stream, listed once with
 * every place that holds it.
 */
import { RandomGenerator } from "../gpu/mod.ts";
import type { Module } from "../nn/module.ts";

/** One generator of a model and every place it is held. */
export interface ModuleGenerator {
  /**
   * Where it is held: the module's path by child index ("" is the model,
   * "3" its fourth child, "1.0" the first child of the second), a colon,
   * and the property ("3:generator").
   */
  at: string[];
  /** The generator itself. */
  generator: RandomGenerator;
}

/**
 * Every {@link RandomGenerator} held by `model` or its descendants, once
 * each, in the order a depth-first walk meets them.
 *
 * @param model The model.
 * @returns The generators, each with the places that hold it.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { Dropout, initGpu, Linear, RandomGenerator, Sequential } from "../mod.ts";
 * import { moduleGenerators } from "./module_generators.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const shared = new RandomGenerator(5);
 * const model = new Sequential(new Linear(2, 2), new Dropout(0.1, { seed: shared }), new Dropout(0.2, { seed: shared }));
 * const found = moduleGenerators(model);
 * assert.equal(found.length, 1);
 * assert.equal(found[0].at.join(), "1:generator,2:generator");
 * gpu.destroy();
 * ```
 */
export function moduleGenerators(model: Module): ModuleGenerator[] {
  const found = new Map<RandomGenerator, string[]>();
  const visit = (m: Module, path: string) => {
    for (const [key, value] of Object.entries(m)) {
      if (!(value instanceof RandomGenerator)) continue;
      const places = found.get(value) ?? [];
      places.push(`${path}:${key}`);
      found.set(value, places);
    }
    m.children().forEach((child, i) => visit(child, path === "" ? `${i}` : `${path}.${i}`));
  };
  visit(model, "");
  return [...found].map(([generator, at]) => ({ generator, at }));
}
