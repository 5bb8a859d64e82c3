/**
 * Dawn, Chrome's WebGPU, as a second backend (`initGpu({ backend: "dawn" })`):
 * it offers what Deno's built-in WebGPU turns off — subgroup matrices (tensor
 * cores), and `shader-f16` on NVIDIA. It ships for Node-API hosts as the npm
 * package `webgpu` ({@link DAWN_PACKAGE}), whose `dawn.node` loads in Deno.
 *
 * It is loaded only when asked for, by {@link importAtRunTime}, so nothing
 * else reaches npm: Deno installs a module graph's npm packages before running
 * it (a machine without a registry would fail at once), `deno publish` warns
 * of a dynamic import it cannot analyze, and esbuild (the browser bundle)
 * tries to bundle what `import()` names. `HALFSTEP_DAWN_NODE=/path/dawn.node`
 * loads the binary from a file instead (a machine that has no registry).
 *
 * NOTE: one Dawn instance serves the whole process. Each `create()` starts
 * its own Vulkan instance, and a process that made one per device aborted
 * (SIGABRT) after about 160 of them.
 */
import { pumpDawnEvents } from "./backend_dawn_events.ts";
import { fail, GpuError } from "../base/errors.ts";

/** The npm package that carries Dawn's Node-API binding, pinned. */
export const DAWN_PACKAGE = "webgpu@0.6.2";

/**
 * Dawn's toggles: `allow_unsafe_apis` exposes the experimental features
 * (subgroup matrices); on NVIDIA, Dawn hides `shader-f16` without
 * `vulkan_enable_f16_on_nvidia`.
 */
export const DAWN_FLAGS: readonly string[] = [
  "enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia",
];

/** What the package's entry (and the binding itself) exports. */
interface DawnModule {
  create(flags: string[]): GPU;
}

const INSTALL_HELP = `Install it with npm's registry reachable (Deno fetches npm:${DAWN_PACKAGE} ` +
  "on first use), or set HALFSTEP_DAWN_NODE to the path of its dist/linux-x64/dawn.node " +
  "(see docs/dawn.md).";

/**
 * Dawn's null backend: adapters and devices that validate every shader,
 * pipeline and command as Dawn does on a GPU (Tint's whole front end,
 * Dawn's pipeline rules) and execute none; reads return arbitrary bytes.
 * For compiling kernels for adapters that are not here
 * (gpu/device/described_adapter.ts) and for timing the host's work alone.
 */
export const DAWN_NULL_FLAGS: readonly string[] = [
  "backend=null",
  "enable-dawn-features=allow_unsafe_apis",
];

/** One instance of each kind per process (see the module note). */
const instances = new Map<"vulkan" | "null", Promise<GPU>>();

/**
 * The process's Dawn entry point (the `navigator.gpu` of the Dawn backend;
 * `null`: of its null backend, {@link DAWN_NULL_FLAGS}), created on first
 * use. A missing or broken Dawn is one `GpuError` line that says what to
 * install.
 */
export function dawnGpu(kind: "vulkan" | "null" = "vulkan"): Promise<GPU> {
  let instance = instances.get(kind);
  if (!instance) {
    instance = loadDawn(kind === "null" ? DAWN_NULL_FLAGS : DAWN_FLAGS).catch((e) => {
      instances.delete(kind); // a later call may try again (after the user fixed the install)
      throw e;
    });
    instances.set(kind, instance);
  }
  return instance;
}

async function loadDawn(flags: readonly string[]): Promise<GPU> {
  const ffi = permission("ffi");
  if (ffi !== undefined && ffi !== "granted") {
    fail(
      GpuError,
      "initGpu",
      "Dawn is a native library (Node-API): run Deno with --allow-ffi (or -A) to use it.",
    );
  }
  const file = environment("HALFSTEP_DAWN_NODE");
  let dawn: DawnModule;
  try {
    dawn = file
      ? await requireNative(file)
      : await importAtRunTime(`npm:${DAWN_PACKAGE}`) as DawnModule;
  } catch (e) {
    const from = file ? `HALFSTEP_DAWN_NODE=${file}` : `npm:${DAWN_PACKAGE}`;
    fail(
      GpuError,
      "initGpu",
      `Dawn could not be loaded from ${from} (${firstLine(e)}). ${INSTALL_HELP}`,
    );
  }
  if (typeof dawn?.create !== "function") {
    fail(GpuError, "initGpu", `Dawn's module has no create() function. ${INSTALL_HELP}`);
  }
  const gpu = dawn.create([...flags]);
  pumpDawnEvents(); // gentle polling, and nothing pending at exit
  return gpu;
}

/**
 * `import(specifier)`, out of sight of every tool that reads imports ahead of
 * time (Deno's module graph, `deno publish`, esbuild): see the module comment.
 * Made only when called, so a page whose Content-Security-Policy forbids
 * `new Function` still loads the library (and never asks for Dawn).
 */
function importAtRunTime(specifier: string): Promise<unknown> {
  const load = new Function("specifier", "return import(specifier)");
  return load(specifier);
}

/** Loads a Node-API binary (`.node`) through Node's `require`, as the npm package does. */
async function requireNative(path: string): Promise<DawnModule> {
  const { createRequire } = await importAtRunTime("node:module") as typeof import("node:module");
  return createRequire(import.meta.url)(path) as DawnModule;
}

/** An environment variable where the runtime grants reading it without a prompt, else undefined. */
export function environment(variable: string): string | undefined {
  if (permission("env", { variable }) !== "granted") return undefined;
  // deno-lint-ignore no-explicit-any
  return (globalThis as any).Deno.env.get(variable) || undefined;
}

/** Deno's permission state for `name` (without a prompt), or undefined outside Deno. */
function permission(name: string, details: Record<string, string> = {}): string | undefined {
  try {
    // deno-lint-ignore no-explicit-any
    return (globalThis as any).Deno?.permissions?.querySync?.({ name, ...details })?.state;
  } catch {
    return undefined;
  }
}

function firstLine(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split("\n")[0].slice(0, 200);
}
