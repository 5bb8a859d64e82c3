/**
 * Scopes for intermediate tensors. JavaScript's garbage collector cannot see
 * GPU memory, so every tensor created inside `tidy(fn)` is disposed when `fn`
 * returns, except the tensors it returns (or passes to `keep`). Memory the
 * autograd tape still needs survives: the tape holds its own reference.
 */
import { ValueError } from "../base/errors.ts";
import { runtime, type ScopedResource, withState } from "./runtime_state.ts";

export type { ScopedResource };

/** Registers a new resource with the innermost open scope, if any. */
export function track(resource: ScopedResource): void {
  if (runtime.tracking) runtime.scopes.at(-1)?.add(resource);
}

/** Takes `resource` out of every open scope so it outlives them. Returns it. */
export function keep<T extends ScopedResource>(resource: T): T {
  for (const scope of runtime.scopes) scope.delete(resource);
  return resource;
}

/**
 * Runs `fn` and disposes every tensor it created except those in its result
 * (a tensor, or an array or plain object of tensors). `fn` must be synchronous.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, mul, sum, Tensor, tidy } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2, 3], [3]);
 * const total = tidy(() => {
 *   const squares = mul(x, x); // freed when tidy returns
 *   return sum(squares); // kept: it is the result
 * });
 * assert.equal(await total.item(), 14);
 * gpu.destroy();
 * ```
 */
export function tidy<T>(fn: () => T): T {
  const scope = new Set<ScopedResource>();
  const scopes = runtime.scopes;
  scopes.push(scope);
  let result: T;
  try {
    result = fn();
    if (result instanceof Promise) {
      throw new ValueError(
        "tidy: fn returned a Promise; tidy only supports synchronous functions.",
      );
    }
  } finally {
    scopes.pop();
  }
  for (const kept of resourcesIn(result)) scope.delete(kept);
  for (const resource of scope) resource.dispose();
  // Returned tensors now belong to the enclosing scope, if there is one.
  for (const kept of resourcesIn(result)) track(kept);
  return result;
}

/** Runs `fn` with tracking switched off: what it creates belongs to the caller. */
export function untracked<T>(fn: () => T): T {
  return withState({ tracking: false }, fn);
}

/**
 * Runs `fn` with tracking on even inside `untracked` (a backward rule that
 * recomputes a region needs its own `tidy` scopes to work).
 */
export function tracked<T>(fn: () => T): T {
  return withState({ tracking: true }, fn);
}

function* resourcesIn(value: unknown): Generator<ScopedResource> {
  if (value === null || typeof value !== "object") return;
  if (typeof (value as ScopedResource).dispose === "function") {
    yield value as ScopedResource;
  } else if (Array.isArray(value)) {
    for (const v of value) yield* resourcesIn(v);
  } else if (Object.getPrototypeOf(value) === Object.prototype) {
    for (const v of Object.values(value)) yield* resourcesIn(v);
  }
}
