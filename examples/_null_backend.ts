/**
 * Dawn's null backend for `bench host`: an adapter that validates and
 * records every command and executes none (reads return arbitrary bytes),
 * so a step's time there is the host's work alone.
 *
 * NOTE (temporary, issue 45): `initGpu` has no way yet to ask Dawn for its
 * null adapter (issue 44 adds one); until it does, this adds Dawn's
 * `backend=null` toggle to `DAWN_FLAGS` before the process's one Dawn
 * instance is made. When initGpu takes the choice, {@link initNullGpu}
 * becomes one `initGpu` call with it.
 */
import { type Gpu, initGpu } from "../mod.ts";
import { DAWN_FLAGS } from "../gpu/mod.ts";

/** A device on Dawn's null backend, not the default one (call before any other Dawn device). */
export async function initNullGpu(): Promise<Gpu> {
  const flags = DAWN_FLAGS as string[];
  if (!flags.includes("backend=null")) flags.push("backend=null");
  return await initGpu({
    backend: "dawn",
    tuning: "off",
    matmulTiling: "default",
    setDefault: false,
  });
}
