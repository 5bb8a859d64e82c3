/**
 * Names and values quoted into error messages, cut short: a message stays one
 * readable line even when a file holds a 10 MB tensor name.
 */

/** Names longer than this are cut (with "…") in messages. */
export const MAX_QUOTED = 80;

/**
 * `text` in double quotes, cut to `MAX_QUOTED` characters with "…" (control
 * characters such as newlines are escaped, so the message stays one line).
 *
 * @param text A tensor name, a metadata key, a path.
 * @returns `"name"`, or `"first 79 characters…"`.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { quoted } from "./short_text.ts";
 * assert.equal(quoted("fc1.weight"), '"fc1.weight"');
 * assert.equal(quoted("x".repeat(10_000_000)).length, 82);
 * ```
 */
export function quoted(text: string): string {
  return `"${cut(text)}"`;
}

/**
 * `text` cut to `MAX_QUOTED` characters with "…", control characters escaped.
 *
 * @param text Anything shown in a message: a name, a JSON value, another error's message.
 * @returns At most `MAX_QUOTED` characters before escaping.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { cut } from "./short_text.ts";
 * assert.equal(cut("[1,2]"), "[1,2]");
 * assert.match(cut("9".repeat(100)), /…$/);
 * ```
 */
export function cut(text: string): string {
  const short = text.length > MAX_QUOTED ? `${text.slice(0, MAX_QUOTED - 1)}…` : text;
  // deno-lint-ignore no-control-regex
  return short.replace(/[\u0000-\u001f\u007f]/g, (c) => JSON.stringify(c).slice(1, -1));
}

/**
 * Any value as a message shows it, one short line: a string {@link quoted},
 * an object as its JSON cut the same way, anything else as `String(value)`.
 *
 * @param value An option or argument the caller got wrong.
 * @returns `"nonsense"`, `{"budget":5}`, `-1`, `undefined`.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { shortValue } from "./short_text.ts";
 * assert.equal(shortValue("sometimes"), '"sometimes"');
 * assert.equal(shortValue({ budget: 5 }), '{"budget":5}');
 * assert.equal(shortValue(undefined), "undefined");
 * ```
 */
export function shortValue(value: unknown): string {
  if (typeof value === "string") return quoted(value);
  let text: string;
  try {
    text = typeof value === "object" && value !== null ? JSON.stringify(value) : String(value);
  } catch {
    text = Object.prototype.toString.call(value); // a cycle, a BigInt inside
  }
  return cut(text);
}
