/** The error of malformed safetensors files (its own file: the checksums throw it too). */
import { HalfstepError } from "../gpu/mod.ts";

/** A file or entry that breaks the safetensors format; the message says what and where. */
export class SafetensorsError extends HalfstepError {
  /**
   * A format error.
   *
   * @param message What is wrong.
   * @param options The underlying error, if any.
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "SafetensorsError";
  }
}
