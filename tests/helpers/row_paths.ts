/**
 * The row kernels' paths (see gpu/kernels/rows/row_layout.ts), for tests that run
 * a row kernel on each: the CPU adapter's (a thread per row up to 4096
 * entries), and as a GPU with several rows per workgroup through workgroup
 * memory and, where the device has them, through subgroups.
 */
import assert from "node:assert/strict";
import { rowSettings } from "../../gpu/kernels/rows/row_layout.ts";
import { gpuLikeProfile, withAdapterProfile } from "../../gpu/tuning/profile_switch.ts";
import { gpu, withSettings } from "./gpu.ts";

/** A row path: how it is entered, and what its kernel keys must show. */
export interface RowPath {
  name: string;
  run<T>(fn: () => Promise<T>): Promise<T>;
}

/** As a GPU (subgroups on or off) with every row on the workgroup/subgroup path (no thread rows). */
function asGpuRows(subgroups: boolean): RowPath {
  return {
    name: subgroups ? "gpu subgroups" : "gpu workgroup memory",
    run: (fn) =>
      withAdapterProfile(
        gpu,
        { ...gpuLikeProfile(gpu), subgroups },
        () => withSettings(rowSettings.of(gpu), { threadRowMax: 0 }, fn),
      ),
  };
}

/** Every row path the device can run. */
export const ROW_PATHS: RowPath[] = [
  { name: "cpu", run: (fn) => fn() },
  asGpuRows(false),
  ...(gpu.subgroups ? [asGpuRows(true)] : []),
];

/** The kernels ran on the path's layout, several rows per workgroup and vec4 where the path has them. */
export function assertPathKeys(path: RowPath, keys: string[], lanes = [4, 32, 64]): void {
  const has = (s: string) => keys.some((k) => k.includes(s));
  assert.ok(keys.length > 0, path.name);
  if (path.name === "cpu") {
    assert.ok(has("layout=thread") && has("width=4"), `${path.name}: ${keys[0]}`);
    return;
  }
  const layout = path.name === "gpu subgroups" ? "layout=subgroup" : "layout=workgroup";
  assert.ok(keys.every((k) => !k.includes("layout=thread")), `${path.name}: a thread row`);
  for (const n of lanes) assert.ok(has(`lanes=${n}`), `${path.name}: lanes ${n}`);
  assert.ok(has(layout) && has("width=4") && has("width=1"), `${path.name}: ${keys[0]}`);
}
