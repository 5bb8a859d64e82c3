/**
 * The errors halfstep throws: one base class, so `catch (e) { if (e instanceof
 * HalfstepError) ... }` catches every one of them, and a subclass per kind of
 * mistake. Messages name the op (or class and method), the shapes and dtypes
 * involved, and what to do, in one sentence-case line.
 */

/** The base of every error halfstep throws. */
export class HalfstepError extends Error {
  /** The class name, e.g. `"ShapeError"`. */
  override name = "HalfstepError";
}

/** Shapes or sizes that do not fit: matmul inner sizes, a bias of the wrong length, a bad axis. */
export class ShapeError extends HalfstepError {
  /** Always `"ShapeError"`. */
  override name = "ShapeError";
}

/** A tensor or value of the wrong element type: f16 where fp32 is required, an unknown dtype. */
export class DTypeError extends HalfstepError {
  /** Always `"DTypeError"`. */
  override name = "DTypeError";
}

/** An argument or option with an invalid value: a negative learning rate, an unknown op name. */
export class ValueError extends HalfstepError {
  /** Always `"ValueError"`. */
  override name = "ValueError";
}

/**
 * An object used in a state that forbids it: a disposed tensor, `unscale()`
 * twice before `update()`, a second backward through freed activations.
 */
export class StateError extends HalfstepError {
  /** Always `"StateError"`. */
  override name = "StateError";
}

/** The GPU itself: no adapter, a lost device, out of memory, a failed command or shader. */
export class GpuError extends HalfstepError {
  /** Always `"GpuError"`. */
  override name = "GpuError";
}

/** A subclass of {@link HalfstepError} (its constructor). */
export type HalfstepErrorClass = new (message: string, options?: ErrorOptions) => HalfstepError;

/**
 * Throws `Kind` with the message `"<where>: <what>"`. Given a list, it throws
 * only when the list is non-empty, with every entry on a line of its own (one
 * entry stays on the first line), so validation can report all problems at once.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { fail, ValueError } from "./errors.ts";
 * const problems: string[] = [];
 * fail(ValueError, "SGD: invalid options", problems); // nothing to report: returns
 * assert.throws(
 *   () => fail(ValueError, "SGD", "lr must be a finite number >= 0, got -1."),
 *   { name: "ValueError", message: "SGD: lr must be a finite number >= 0, got -1." },
 * );
 * ```
 */
export function fail(Kind: HalfstepErrorClass, where: string, what: string): never;
/** Throws `Kind` listing every problem in `what`, one per line; returns when there are none. */
export function fail(Kind: HalfstepErrorClass, where: string, what: readonly string[]): void;
export function fail(
  Kind: HalfstepErrorClass,
  where: string,
  what: string | readonly string[],
): void {
  if (typeof what === "string") throw new Kind(`${where}: ${what}`);
  if (what.length === 0) return;
  const list = what.length === 1 ? `: ${what[0]}.` : `:\n  - ${what.join("\n  - ")}`;
  throw new Kind(`${where}${list}`);
}

/**
 * Throws a {@link ValueError} unless `options` is undefined or a plain object
 * whose keys are all in `known`: from plain JavaScript an old positional
 * argument (a metadata map, a number) passed where an options object now
 * stands would otherwise be ignored without a word.
 *
 * @param where The function, e.g. `"saveModule"`.
 * @param options What the caller passed.
 * @param known The option names the function takes.
 * @param hint What to do instead, appended to the message.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkOptionNames } from "./errors.ts";
 * checkOptionNames("save", { metadata: {} }, ["metadata"], "");
 * assert.throws(
 *   () => checkOptionNames("save", { step: "1" }, ["metadata"], "put it in { metadata }."),
 *   { name: "ValueError", message: /^save: unknown option step/ },
 * );
 * ```
 */
export function checkOptionNames(
  where: string,
  options: unknown,
  known: readonly string[],
  hint: string,
): void {
  if (options === undefined) return;
  if (typeof options !== "object" || options === null || Array.isArray(options)) {
    const got = options === null ? "null" : Array.isArray(options) ? "an array" : typeof options;
    fail(ValueError, where, `options must be an object { ${known.join(", ")} }, got ${got}.`);
  }
  const unknown = Object.keys(options).filter((k) => !known.includes(k));
  if (unknown.length > 0) {
    const names = unknown.slice(0, 3).map((k) => k.length > 40 ? `${k.slice(0, 40)}…` : k);
    fail(
      ValueError,
      where,
      `unknown option${unknown.length > 1 ? "s" : ""} ${names.join(", ")} ` +
        `(known: ${known.join(", ")}); ${hint}`,
    );
  }
}
