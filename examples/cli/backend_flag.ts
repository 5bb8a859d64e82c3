/**
 * `--backend builtin|dawn|dawn-null`, shared by the examples and the benchmark: which
 * WebGPU implementation `initGpu` takes its device from (see docs/dawn.md).
 * Without the flag, `initGpu` reads `HALFSTEP_BACKEND`, else takes Deno's own.
 */
import type { Gpu } from "../../mod.ts";
import { type Backend, BACKENDS, type SubgroupMatrixConfig } from "../../gpu/mod.ts";
import { choiceFlag } from "./flags.ts";

/** The flag's lines in a help text, the value called `value`, the description from column `column`. */
export function backendHelp(column: number, value = "NAME"): string {
  const pad = (text: string) => text.padEnd(column);
  return [
    `${pad(`  --backend ${value}`)}WebGPU implementation: builtin (Deno's own, the default),`,
    `${pad("")}dawn (Chrome's Dawn from npm webgpu, with subgroup`,
    `${pad("")}matrices; see docs/dawn.md) or dawn-null (Dawn's null`,
    `${pad("")}backend: compiles, executes nothing). Default: HALFSTEP_BACKEND`,
  ].join("\n");
}

/** The backend `--backend` names (a UsageError for another word), or undefined when absent. */
export function backendFlag(text: string | undefined): Backend | undefined {
  return text === undefined ? undefined : choiceFlag("backend", text, BACKENDS);
}

/**
 * What a run prints after the adapter's name: nothing on the builtin
 * backend; on Dawn the backend and the subgroup-matrix shapes.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { backendNote } from "./backend_flag.ts";
 * const f16 = { componentType: "f16", resultComponentType: "f32" };
 * const configs = [{ ...f16, M: 8, N: 8, K: 8, subgroupSize: 8 }];
 * const note = backendNote({ backend: "dawn", subgroupMatrixConfigs: configs });
 * assert.equal(note, " (Dawn; subgroup matrices f16→f32 8×8×8)");
 * assert.equal(backendNote({ backend: "builtin", subgroupMatrixConfigs: [] }), "");
 * ```
 */
export function backendNote(gpu: Pick<Gpu, "backend" | "subgroupMatrixConfigs">): string {
  if (gpu.backend === "builtin") return "";
  const what = gpu.backend === "dawn-null" ? "Dawn's null backend: nothing executes" : "Dawn";
  return ` (${what}; subgroup matrices ${subgroupMatrixShapes(gpu.subgroupMatrixConfigs)})`;
}

/** `f16→f32 8×8×8, u8→u32 8×8×8`, or `none`. */
export function subgroupMatrixShapes(configs: readonly SubgroupMatrixConfig[]): string {
  return configs.map((c) => `${c.componentType}→${c.resultComponentType} ${c.M}×${c.N}×${c.K}`)
    .join(", ") || "none";
}
