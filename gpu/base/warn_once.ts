/** Warnings shown once per process: a hint repeated every step would drown the log. */

/** Warnings already printed. */
const warned = new Set<string>();

/** Prints `message` as a warning the first time it is given, and never again. */
export function warnOnce(message: string): void {
  if (warned.has(message)) return;
  warned.add(message);
  console.warn(`[halfstep] ${message}`);
}
