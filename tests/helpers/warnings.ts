/** Collects what `console.warn` prints while `fn` runs (and restores it after). */
export async function capturedWarnings(fn: () => unknown): Promise<string[]> {
  const warnings: string[] = [];
  const warn = console.warn;
  console.warn = (...args: unknown[]) => warnings.push(args.join(" "));
  try {
    await fn();
  } finally {
    console.warn = warn;
  }
  return warnings;
}
