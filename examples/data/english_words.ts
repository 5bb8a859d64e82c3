/**
 * The English word list tiny_gpt.ts trains on: the npm package
 * `an-array-of-english-words` (274,937 lowercase words, a 3 MB JSON file).
 * In a file of its own because Deno fetches the npm packages a script's
 * module graph names before it runs: gpt2.ts shares data/words.ts's
 * windows and batches, and never downloads the list.
 *
 * @module
 */

/** The list of ~275k English words (loaded on first call). */
export async function loadEnglishWords(): Promise<string[]> {
  const module = await import("npm:an-array-of-english-words@2.0.0", { with: { type: "json" } });
  return module.default as string[];
}
