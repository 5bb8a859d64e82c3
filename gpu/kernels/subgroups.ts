/**
 * Subgroup operations in kernels. A kernel that uses them takes a
 * {@link SubgroupMode} in its config: `"off"` writes the workgroup-memory
 * version, `"on"` the subgroup one, and `"enable"` the subgroup one after
 * `enable subgroups;`, which Chrome requires and naga (Deno) rejects
 * (`gpu.subgroupsDirective`, probed by `initGpu`).
 *
 * Which kernels use them reads the adapter profile: a GPU with the
 * `subgroups` feature. CPU adapters keep the workgroup-memory kernels, as
 * measured there (lavapipe grants the feature, with subgroups of 8).
 */
import type { Gpu } from "../device.ts";
import type { KernelConfig, KernelDefinition } from "../kernel.ts";

/** Whether (and how) a kernel uses subgroup operations. */
export type SubgroupMode = "off" | "on" | "enable";

/** The mode kernels on `gpu` use: subgroups on GPUs whose profile grants them. */
export function subgroupMode(gpu: Gpu): SubgroupMode {
  const p = gpu.adapterProfile;
  if (p.cpu || !p.subgroups) return "off";
  return gpu.subgroupsDirective ? "enable" : "on";
}

/**
 * `definition` with `enable subgroups;` put first in its WGSL when its
 * config's `subgroups` is `"enable"` (directives precede the generated header).
 */
export function withSubgroupsDirective<
  C extends KernelConfig & { subgroups: SubgroupMode },
  B extends string,
  U extends string,
>(definition: KernelDefinition<C, B, U>): KernelDefinition<C, B, U> {
  return {
    ...definition,
    wgsl: (config) =>
      (config.subgroups === "enable" ? "enable subgroups;\n" : "") + definition.wgsl(config),
  };
}
