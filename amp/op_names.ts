/**
 * Names for the ops a step runs, by the module that ran them: the module's
 * path as in state dicts (`"0"`, `"blocks.2.fc1"`), or, outside submodules,
 * the op's name and its call index in the step (`"cross_entropy:0"`). The
 * running module is known by wrapping each submodule's `forward` (and its
 * `forward*` variants, such as the fused forward `Sequential` calls) for the
 * length of a step only, so a model that is not being named runs untouched.
 */
import type { OpName } from "../gpu/mod.ts";
import type { Module } from "../nn/module.ts";

/** Names ops by the module of `model` that runs them (see the module docs). */
export class OpNames {
  #model: Module;
  #path: string[] = [];
  #outsideCalls = new Map<OpName, number>();

  /** Names for `model`'s ops. */
  constructor(model: Module) {
    this.#model = model;
  }

  /**
   * Runs `fn` (synchronous) as one step with every submodule's forward
   * wrapped to track the running module, and unwraps them after, even when
   * `fn` throws. Call indices outside submodules start again at 0.
   */
  during<T>(fn: () => T): T {
    this.#path = [];
    this.#outsideCalls.clear();
    const restore = this.#wrapForwards();
    try {
      return fn();
    } finally {
      restore();
    }
  }

  /** The name of an `op` starting now; outside submodules each call takes the next index. */
  next(op: OpName): string {
    const module = this.#path.at(-1);
    if (module !== undefined) return module;
    const index = this.#outsideCalls.get(op) ?? 0;
    this.#outsideCalls.set(op, index + 1);
    return `${op}:${index}`;
  }

  /** The running module's path, or undefined outside submodules (nothing counted). */
  get module(): string | undefined {
    return this.#path.at(-1);
  }

  #wrapForwards(): () => void {
    const undo: (() => void)[] = [];
    const path = this.#path;
    for (const [name, module] of this.#model.namedModules()) {
      if (name === "") continue; // the root's own ops are named like ops outside the model
      const target = module as unknown as Record<string, unknown>;
      for (const method of forwardMethods(module)) {
        const own = Object.hasOwn(module, method);
        const original = target[method] as (...args: unknown[]) => unknown;
        target[method] = function (this: Module, ...args: unknown[]) {
          path.push(name);
          try {
            return original.apply(this, args);
          } finally {
            path.pop();
          }
        };
        undo.push(() => {
          if (own) target[method] = original;
          else delete target[method];
        });
      }
    }
    return () => undo.forEach((f) => f());
  }
}

/** The names of `module`'s methods that run it: `forward` and any `forward*`. */
function forwardMethods(module: Module): string[] {
  const names = new Set<string>();
  const methods = module as unknown as Record<string, unknown>;
  for (let o: object | null = module; o !== null && o !== Object.prototype;) {
    for (const key of Object.getOwnPropertyNames(o)) {
      if (key.startsWith("forward") && typeof methods[key] === "function") names.add(key);
    }
    o = Object.getPrototypeOf(o);
  }
  return [...names];
}
