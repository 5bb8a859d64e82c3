/**
 * Kernels as data. A definition declares, as a function of a small config
 * (dtype, tile sizes, epilogue, ...), its storage bindings (name, element
 * type, access) and its uniform fields (name, scalar type), and writes the
 * WGSL that follows them. From that one declaration come both the WGSL header
 * (`enable f16;`, the subgroup-matrix `enable` its source needs, the
 * `Params` struct, every `@binding` line; `enable subgroups;` is the
 * pipeline cache's, per device) and, at
 * dispatch, the bind group: buffers and uniforms are passed by name, so the
 * two can never disagree.
 *
 * Pipelines are cached under a key derived from the same config, so a key
 * can never disagree with the code it names. Sizes that vary per call go in
 * the uniforms, never in the config.
 */
import { type DType, wgslEnables } from "../base/dtype.ts";
import { fail, GpuError, ValueError } from "../base/errors.ts";

/** A config is a flat record of primitives (it becomes part of the cache key). */
export type KernelConfig = Readonly<Record<string, string | number | boolean>>;

/** What a storage binding's array holds, as WGSL spells it. */
export type ElementType =
  | DType
  | "u32"
  | "atomic<u32>"
  | `vec${2 | 4}<${"f32" | "f16"}>`
  | "vec4<bf16>";

/** One storage binding of a kernel: `var<storage, read|read_write> name: array<type>`. */
export interface Binding<N extends string = string> {
  /** The WGSL variable, and the key of its tensor at dispatch. */
  readonly name: N;
  /** Element type of the array. */
  readonly type: ElementType;
  /** Written by the kernel (bound `read_write`); default read-only. */
  readonly write?: boolean;
}

/** The most uniform fields a kernel may declare (the command batch binds 256 bytes of them). */
export const MAX_UNIFORMS = 64;

/** The scalar type of a uniform field. `f32` fields are given as numbers and stored as their bits. */
export type UniformType = "u32" | "i32" | "f32";

/** The uniform fields of a kernel, in declaration order: name → scalar type. */
export type UniformFields<U extends string> = Readonly<Record<U, UniformType>>;

/** What a kernel family declares. */
export interface KernelSpec<C extends KernelConfig, B extends string, U extends string> {
  /** Family name, shown in errors, debug output and the cache key. */
  readonly name: string;
  /** The storage bindings for `config`, in binding order (0, 1, ...). */
  bindings(config: C): readonly Binding<B>[];
  /** Uniform fields, read in WGSL as `p.<name>` (none: the kernel binds no uniform). */
  readonly uniforms: UniformFields<U>;
  /** The WGSL after the generated header: helpers, workgroup variables and `main`. */
  source(config: C): string;
}

/** A kernel family: its declaration plus the complete WGSL for a config. */
export interface KernelDefinition<C extends KernelConfig, B extends string, U extends string>
  extends KernelSpec<C, B, U> {
  /** The whole WGSL for `config`: generated header, then {@link KernelSpec.source}. */
  wgsl(config: C): string;
}

/** Subgroup builtin functions or values in WGSL (subgroup matrices have their own extension). */
const SUBGROUP_USE = /\bsubgroup(?!Matrix)(?:[A-Z]\w*\s*\(|_size\b|_invocation_id\b|_id\b)/;

/**
 * Subgroup-matrix types or builtins in WGSL (Dawn's experimental extension,
 * see gpu/device/subgroup_matrix_configs.ts).
 */
const SUBGROUP_MATRIX_USE = /\bsubgroup(?:Matrix[A-Z]\w*|_matrix_\w+)\s*[<(]/;

/** A pinned subgroup size (`@subgroup_size(n)`, Dawn's `subgroup_size_control` extension). */
const SUBGROUP_SIZE_USE = /@subgroup_size\s*\(/;

/**
 * `wgsl` with `enable subgroups;` first where it uses subgroups and the
 * device's WGSL front end wants the line: Tint (Dawn, Chrome) requires it,
 * naga (Deno's WebGPU) rejects it. Per device, since one process may hold
 * devices of both backends.
 */
export function withSubgroupsDirective(wgsl: string, directive: boolean): string {
  return directive && SUBGROUP_USE.test(wgsl) ? `enable subgroups;\n${wgsl}` : wgsl;
}

/** The WGSL array element that stores `type`: bf16 is packed two to a u32 word. */
function storedType(b: Binding): string {
  if (b.type === "bf16") return b.write ? "atomic<u32>" : "u32";
  if (b.type === "vec4<bf16>") return "vec2<u32>";
  return b.type;
}

/** The WGSL header a declaration produces: enables, `Params`, bindings, uniform, accessors. */
function header(
  bindings: readonly Binding[],
  uniforms: UniformFields<string>,
  source: string,
): string {
  const fields = Object.entries(uniforms).map(([name, type]) => `${name}: ${type}`);
  const lines = bindings.map((b, i) =>
    `@group(0) @binding(${i}) var<storage, ${b.write ? "read_write" : "read"}> ${b.name}: ` +
    `array<${storedType(b)}>;`
  );
  if (fields.length > 0) {
    lines.unshift(`struct Params { ${fields.join(", ")} }`);
    lines.push(`@group(0) @binding(${bindings.length}) var<uniform> p: Params;`);
  }
  const f16 = bindings.some((b) => F16_TYPES.has(b.type));
  const matrices = SUBGROUP_MATRIX_USE.test(source);
  const pinned = SUBGROUP_SIZE_USE.test(source);
  return `${matrices ? "enable chromium_experimental_subgroup_matrix;\n" : ""}${
    pinned ? "enable subgroup_size_control;\n" : ""
  }${wgslEnables(f16 ? "f16" : "f32")}${lines.join("\n")}\n${accessors(bindings, source)}`;
}

const F16_TYPES: ReadonlySet<string> = new Set(["f16", "vec2<f16>", "vec4<f16>"]);

/**
 * Element accessors, so one kernel source serves every float dtype: for a
 * binding `x` the source may call `ld_x(i) -> f32`, `st_x(i, v: f32)`,
 * `st2_x(w, v: vec2<f32>)` (elements 2w and 2w+1: one whole word, for a thread
 * that owns both), and on a vec4 binding `ld4_x(i) -> vec4<f32>`,
 * `st4_x(i, v: vec4<f32>)`. Only the accessors the source calls are emitted.
 *
 * bf16 reads widen with a shift; writes round to nearest-even (NaN → the quiet
 * NaN 0x7FC0, see gpu/base/bf16.ts). Two bf16 values share a word, so a single-element store clears
 * and sets only its own half with two atomics: threads writing the two
 * halves of one word never clobber each other, in any order.
 */
function accessors(bindings: readonly Binding[], source: string): string {
  const out: string[] = [];
  let bf16 = false;
  const uses = (fn: string) => new RegExp(`\\b${fn}\\s*\\(`).test(source);
  for (const b of bindings) {
    const x = b.name;
    const packed = b.type === "bf16" || b.type === "vec4<bf16>";
    const before = out.length;
    // i32 too (widened to f32), so a kernel that also runs on i32 (a cast, a sum) needs one source.
    if (b.type === "f32" || b.type === "f16" || b.type === "bf16" || b.type === "i32") {
      if (uses(`ld_${x}`)) {
        out.push(
          !packed
            ? `fn ld_${x}(i: u32) -> f32 { return f32(${x}[i]); }`
            : `fn ld_${x}(i: u32) -> f32 { return bf16_half(${
              b.write ? `atomicLoad(&${x}[i >> 1u])` : `${x}[i >> 1u]`
            }, i & 1u); }`,
        );
      }
      if (b.write && uses(`st_${x}`)) {
        out.push(
          !packed
            ? `fn st_${x}(i: u32, v: f32) { ${x}[i] = ${b.type}(v); }`
            : `fn st_${x}(i: u32, v: f32) {
  let shift = (i & 1u) * 16u;
  atomicAnd(&${x}[i >> 1u], ~(0xffffu << shift));
  atomicOr(&${x}[i >> 1u], bf16_bits(v) << shift);
}`,
        );
      }
      if (b.write && uses(`st2_${x}`)) {
        out.push(
          !packed
            ? `fn st2_${x}(w: u32, v: vec2<f32>) { ${x}[2u * w] = ${b.type}(v.x); ${x}[2u * w + 1u] = ${b.type}(v.y); }`
            : `fn st2_${x}(w: u32, v: vec2<f32>) { atomicStore(&${x}[w], bf16_pack(v)); }`,
        );
      }
    } else if (b.type === "vec4<f32>" || b.type === "vec4<f16>" || b.type === "vec4<bf16>") {
      if (uses(`ld4_${x}`)) {
        out.push(
          !packed
            ? `fn ld4_${x}(i: u32) -> vec4<f32> { return vec4<f32>(${x}[i]); }`
            : `fn ld4_${x}(i: u32) -> vec4<f32> { let w = ${x}[i]; return vec4<f32>(bf16_half(w.x, 0u), bf16_half(w.x, 1u), bf16_half(w.y, 0u), bf16_half(w.y, 1u)); }`,
        );
      }
      if (b.write && uses(`st4_${x}`)) {
        out.push(
          !packed
            ? `fn st4_${x}(i: u32, v: vec4<f32>) { ${x}[i] = ${b.type}(v); }`
            : `fn st4_${x}(i: u32, v: vec4<f32>) { ${x}[i] = vec2<u32>(bf16_pack(v.xy), bf16_pack(v.zw)); }`,
        );
      }
    }
    bf16 ||= packed && out.length > before;
  }
  if (bf16) out.unshift(BF16_WGSL);
  return out.length > 0 ? out.join("\n") + "\n" : "";
}

/**
 * WGSL helpers of the bf16 accessors (see {@link accessors}):
 * `bf16_half(word, half) -> f32`, `bf16_bits(v: f32) -> u32` (rounded to
 * nearest-even, NaN → 0x7FC0) and `bf16_pack(v: vec2<f32>) -> u32`. Exported
 * for kernels that work on the raw words of bf16 data bound as `u32` (which
 * then must not call the accessors, or the helpers are defined twice).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { BF16_WGSL } from "./kernel.ts";
 * assert.ok(BF16_WGSL.includes("fn bf16_bits(v: f32) -> u32"));
 * ```
 */
export const BF16_WGSL = `fn bf16_half(word: u32, half: u32) -> f32 {
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, half == 1u));
}
fn bf16_bits(v: f32) -> u32 {
  let b = bitcast<u32>(v);
  if ((b & 0x7fffffffu) > 0x7f800000u) { return 0x7fc0u; }
  return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
fn bf16_pack(v: vec2<f32>) -> u32 { return bf16_bits(v.x) | (bf16_bits(v.y) << 16u); }`;

/**
 * Defines a kernel family from its declaration.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { defineKernel } from "./kernel.ts";
 * const axpy = defineKernel({
 *   name: "axpy",
 *   bindings: (c: { dtype: "f32" | "f16" }) => [
 *     { name: "x", type: c.dtype },
 *     { name: "y", type: c.dtype, write: true },
 *   ],
 *   uniforms: { n: "u32", alpha: "f32" },
 *   source: (c) => `@compute @workgroup_size(64)
 * fn main(@builtin(global_invocation_id) id: vec3<u32>) {
 *   if (id.x < p.n) { y[id.x] = ${c.dtype}(p.alpha * f32(x[id.x]) + f32(y[id.x])); }
 * }`,
 * });
 * assert.ok(axpy.wgsl({ dtype: "f16" }).startsWith("enable f16;"));
 * // Dispatch by name: gpu.dispatch(gpu.kernel(axpy, { dtype }), { x, y }, { n, alpha: 2 }, [groups]).
 * ```
 */
export function defineKernel<C extends KernelConfig, B extends string, U extends string>(
  spec: KernelSpec<C, B, U>,
): KernelDefinition<C, B, U> {
  const definition = defineKernelOnce(spec);
  DEFINED.push(definition as unknown as KernelDefinition<KernelConfig, string, string>);
  return definition;
}

/** Every kernel family defined so far (by the modules loaded), in definition order. */
const DEFINED: KernelDefinition<KernelConfig, string, string>[] = [];

/**
 * Every kernel family the loaded modules defined with {@link defineKernel}:
 * what a compile check must build at least once. @internal
 */
export function definedKernels(): readonly KernelDefinition<KernelConfig, string, string>[] {
  return DEFINED;
}

function defineKernelOnce<C extends KernelConfig, B extends string, U extends string>(
  spec: KernelSpec<C, B, U>,
): KernelDefinition<C, B, U> {
  const words = Object.keys(spec.uniforms).length;
  if (words > MAX_UNIFORMS) {
    fail(
      ValueError,
      "defineKernel",
      `${spec.name} declares ${words} uniforms; at most ${MAX_UNIFORMS}.`,
    );
  }
  return {
    ...spec,
    wgsl: (config) => {
      const source = spec.source(config);
      return header(spec.bindings(config), spec.uniforms, source) + source;
    },
  };
}

/** `[binding]` when `on`, else nothing: for bindings a config may leave out. */
export function optional<B extends string>(on: boolean, binding: Binding<B>): Binding<B>[] {
  return on ? [binding] : [];
}

/** The pipeline cache key for `config` of `definition`: name plus sorted config entries. */
export function kernelKey<C extends KernelConfig>(
  definition: { readonly name: string },
  config: C,
): string {
  const entries = Object.keys(config).sort().map((k) => `${k}=${config[k]}`);
  return `${definition.name}{${entries.join(",")}}`;
}

/** The bits of an f32 as a u32 word. */
export function f32Bits(x: number): number {
  F32[0] = x;
  return U32[0];
}
const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** A compiled kernel ready to dispatch, with the binding order and uniform layout of its config. */
export interface CompiledKernel<B extends string = string, U extends string = string> {
  /** The cache key (see {@link kernelKey}). */
  readonly key: string;
  /** The compute pipeline. */
  readonly pipeline: GPUComputePipeline;
  /** Its bind group 0 layout, made from the declaration. */
  readonly layout: GPUBindGroupLayout;
  /** Storage bindings in binding order. */
  readonly bindings: readonly Binding<B>[];
  /** Uniform fields in declaration order. */
  readonly uniforms: readonly (readonly [U, UniformType])[];
  /**
   * Whether the shader and pipeline compiled: `"pending"` until the device
   * has said (asynchronously), then `"ok"` or the error. Until it is known,
   * dispatches of this kernel are submitted on their own inside an error
   * scope, so a kernel that fails breaks only its own op.
   */
  readonly compiled: { state: "pending" | "ok" } | { state: "failed"; error: GpuError };
}

/** Buffers of one dispatch, by binding name (a config's optional bindings may be left out). */
export type DispatchBuffers<B extends string> = {
  readonly [K in B]?: { readonly buffer: GPUBuffer };
};

/** Uniform values of one dispatch, by field name. */
export type DispatchUniforms<U extends string> = { readonly [K in U]: number };

/**
 * The bind-group inputs of one dispatch of `kernel`: its buffers in binding
 * order and its uniform words. Throws, naming the kernel, on a missing or
 * unknown buffer and on a uniform value its type cannot hold.
 */
export function bindingValues<B extends string, U extends string>(
  kernel: CompiledKernel<B, U>,
  buffers: DispatchBuffers<B>,
  uniforms: DispatchUniforms<U>,
): { buffers: GPUBuffer[]; words: number[] } {
  // Plain loops: this runs for every dispatch, so it allocates only its two results.
  const bindings = kernel.bindings;
  const list = new Array<GPUBuffer>(bindings.length);
  for (let i = 0; i < bindings.length; i++) {
    const t = buffers[bindings[i].name];
    if (!t) fail(ValueError, kernel.key, `no buffer given for binding '${bindings[i].name}'.`);
    list[i] = t.buffer;
  }
  let given = 0;
  for (const name in buffers) if (buffers[name] !== undefined) given++;
  if (given !== list.length) {
    const known = new Set<string>(bindings.map((b) => b.name));
    const extra = Object.keys(buffers).filter((name) => !known.has(name));
    fail(ValueError, kernel.key, `unknown bindings ${extra.join(", ")} (it has ${[...known]}).`);
  }
  const fields = kernel.uniforms;
  const words = new Array<number>(fields.length);
  for (let i = 0; i < fields.length; i++) {
    const [name, type] = fields[i];
    words[i] = uniformWord(kernel.key, name, type, uniforms[name]);
  }
  return { buffers: list, words };
}

/**
 * The u32 word a uniform field of `type` holds for `value` (an f32's bits);
 * throws, naming `where` (the kernel) and the field, on a value the type
 * cannot hold. What {@link bindingValues} packs, and what a replayed step
 * packs for the fields it recomputes (see `LiveUniforms`).
 */
export function uniformWord(where: string, name: string, type: UniformType, value: number): number {
  if (type === "f32") return f32Bits(value);
  const ok = type === "u32" ? value >>> 0 === value : (value | 0) === value;
  if (!ok) fail(ValueError, where, `uniform ${name} (${type}) cannot hold ${value}.`);
  return value >>> 0;
}

/**
 * The uniform fields of a dispatch that change from one step to the next
 * while everything else stays (a learning rate set by a schedule, a dropout
 * range): a function that gives their current values by name. Eager
 * dispatches ignore it; a captured step calls it at every replay and writes
 * the words it gives into its uniforms (see command_graph.ts).
 */
export type LiveUniforms<U extends string = string> = () => { readonly [K in U]?: number };

/** Compiles pipelines on first use and keeps them for the life of the device. */
export class PipelineCache {
  #pipelines = new Map<string, CompiledKernel>();
  /**
   * The same pipelines by definition and the config's values in the order
   * its keys were written: what every dispatch looks up, without sorting the
   * config (a config spelled in another order misses here and finds its
   * pipeline under the sorted key).
   */
  #byValues = new WeakMap<object, Map<string, CompiledKernel>>();
  #layouts = new Map<string, GPUBindGroupLayout>();
  #device: GPUDevice;
  #onCompile: (key: string, wgsl: string) => void;
  #subgroupsDirective: boolean;

  /**
   * A cache for `device`; `onCompile` sees each new key and its WGSL (debug
   * output); `subgroupsDirective`: the device wants `enable subgroups;`
   * (see {@link withSubgroupsDirective}).
   */
  constructor(
    device: GPUDevice,
    onCompile: (key: string, wgsl: string) => void,
    subgroupsDirective = false,
  ) {
    this.#device = device;
    this.#onCompile = onCompile;
    this.#subgroupsDirective = subgroupsDirective;
  }

  /** The pipeline for `config`, compiling it the first time. */
  get<C extends KernelConfig, B extends string, U extends string>(
    definition: KernelDefinition<C, B, U>,
    config: C,
  ): CompiledKernel<B, U> {
    let fast = "";
    for (const k in config) fast += `${k}=${config[k]},`;
    let byValues = this.#byValues.get(definition);
    if (!byValues) this.#byValues.set(definition, byValues = new Map());
    let found = byValues.get(fast) as CompiledKernel<B, U> | undefined;
    if (!found) {
      found = this.#compiled(definition, config);
      byValues.set(fast, found as CompiledKernel);
    }
    return found;
  }

  /** The pipeline under `config`'s sorted key, compiled the first time. */
  #compiled<C extends KernelConfig, B extends string, U extends string>(
    definition: KernelDefinition<C, B, U>,
    config: C,
  ): CompiledKernel<B, U> {
    const key = kernelKey(definition, config);
    let compiled = this.#pipelines.get(key) as CompiledKernel<B, U> | undefined;
    if (!compiled) {
      const bindings = definition.bindings(config);
      const uniforms = Object.entries(definition.uniforms) as [U, UniformType][];
      const code = withSubgroupsDirective(definition.wgsl(config), this.#subgroupsDirective);
      this.#onCompile(key, code);
      // In the scope too: a layout the device cannot take (too many storage buffers) is this
      // kernel's failure, not the device's.
      this.#device.pushErrorScope("validation");
      const layout = this.#layout(bindings, uniforms.length > 0);
      const module = this.#device.createShaderModule({ label: key, code });
      const pipeline = this.#device.createComputePipeline({
        label: key,
        layout: this.#device.createPipelineLayout({ label: key, bindGroupLayouts: [layout] }),
        compute: { module, entryPoint: "main" },
      });
      const entry: { -readonly [K in keyof CompiledKernel<B, U>]: CompiledKernel<B, U>[K] } = {
        key,
        pipeline,
        layout,
        bindings,
        uniforms,
        compiled: { state: "pending" },
      };
      this.#device.popErrorScope().then((error) => {
        entry.compiled = error
          ? {
            state: "failed",
            error: new GpuError(
              `kernel ${key} failed to compile: ${error.message}. Only ops that use it fail; ` +
                "the device stays usable.",
            ),
          }
          : { state: "ok" };
      });
      compiled = entry;
      this.#pipelines.set(key, compiled as CompiledKernel);
    }
    return compiled;
  }

  /** Number of distinct pipelines compiled so far. */
  get size(): number {
    return this.#pipelines.size;
  }

  /** Every pipeline compiled so far, with its state (for compile checks; see `CompiledKernel.compiled`). */
  entries(): IterableIterator<CompiledKernel> {
    return this.#pipelines.values();
  }

  /**
   * The bind-group layout of a binding list, shared by every kernel with the
   * same one (so they can share cached bind groups). The uniform, when there
   * is one, is bound with a dynamic offset into the command batch's arena.
   */
  #layout(bindings: readonly Binding[], uniform: boolean): GPUBindGroupLayout {
    const signature = bindings.map((b) => (b.write ? "w" : "r")).join("") + (uniform ? "u" : "");
    let layout = this.#layouts.get(signature);
    if (!layout) {
      const entries: GPUBindGroupLayoutEntry[] = bindings.map((b, binding) => ({
        binding,
        visibility: GPUShaderStage.COMPUTE,
        buffer: { type: b.write ? "storage" : "read-only-storage" },
      }));
      if (uniform) {
        entries.push({
          binding: bindings.length,
          visibility: GPUShaderStage.COMPUTE,
          buffer: { type: "uniform", hasDynamicOffset: true },
        });
      }
      layout = this.#device.createBindGroupLayout({ label: `halfstep ${signature}`, entries });
      this.#layouts.set(signature, layout);
    }
    return layout;
  }
}
