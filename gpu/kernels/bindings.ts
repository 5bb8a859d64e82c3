/**
 * Binding lists for kernels whose buffers depend on their config (optional
 * weight, bias, ...). One list both declares the WGSL variables and orders
 * the buffers at dispatch, so the two cannot disagree.
 */
import { type DType, wgslEnables } from "../dtype.ts";
import type { Tensor } from "../tensor.ts";

/** One storage binding: a WGSL name, its element type and access mode. */
export interface Binding {
  /** WGSL variable name, also the key of the tensor at dispatch. */
  name: string;
  /** Element type. */
  type: DType;
  /** Bound read_write (default read-only). */
  write?: boolean;
}

/** `enable f16;` if needed, the `Params` struct, every storage binding, then the uniform. */
export function declareBindings(bindings: readonly Binding[], params: string): string {
  const vars = bindings.map((b, i) =>
    `@group(0) @binding(${i}) var<storage, ${
      b.write ? "read_write" : "read"
    }> ${b.name}: array<${b.type}>;`
  );
  return `${wgslEnables(...bindings.map((b) => b.type))}struct Params { ${params} }
${vars.join("\n")}
@group(0) @binding(${bindings.length}) var<uniform> p: Params;
`;
}

/** The buffers of `tensors` in binding order. */
export function buffersFor(
  bindings: readonly Binding[],
  tensors: Record<string, Tensor>,
): GPUBuffer[] {
  return bindings.map((b) => tensors[b.name].buffer);
}

/** `[binding]` when `on`, else nothing (for optional buffers). */
export function optionalBinding(on: boolean, binding: Binding): Binding[] {
  return on ? [binding] : [];
}
