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
 * import { quoted } from "./short_text.ts";
 * console.assert(quoted("fc1.weight") === '"fc1.weight"');
 * console.assert(quoted("x".repeat(10_000_000)).length === 82);
 * ```
 */
export function quoted(text: string): string {
  const cut = text.length > MAX_QUOTED ? `${text.slice(0, MAX_QUOTED - 1)}…` : text;
  // deno-lint-ignore no-control-regex
  return `"${cut.replace(/[\u0000-\u001f\u007f]/g, (c) => JSON.stringify(c).slice(1, -1))}"`;
}
