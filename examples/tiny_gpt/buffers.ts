/**
 * The largest buffers of a tiny GPT run (training, evaluation, sampling), for
 * the preflight check of `tiny_gpt.ts` (cli/preflight.ts).
 *
 * @module
 */
import type { GptConfig } from "../../models/mod.ts";
import type { Growth, PlannedBuffer } from "../cli/preflight.ts";

/** The flags that size a Gpt run, for {@link tinyGptBuffers}. */
export interface TinyGptRunSizes {
  /** Sequences per training and evaluation step. */
  batch: number;
  /** Sequences sampled at once. */
  samples: number;
  /** Validation windows (held on the host). */
  evalWindows: number;
}

/**
 * The largest buffers of a training step, evaluation and sampling of a
 * Gpt (f32, the widest case), on the GPU and on the host, each
 * with the flags its size grows with. On the GPU: the MLP's hidden rows
 * [B·T, 4C] (the widest activation), the attention's q, k, v [B·T, 3C], the
 * logits [B·T, V], the widest weight (fc1, [C, 4C]), the position table and,
 * without fused attention, the scores [B·H, T, T]. On the host: every
 * parameter's initial values and the validation windows. Keep it in step with
 * the model: tests/examples/examples_preflight_test.ts checks it is never below the
 * pool's largest request.
 */
export function tinyGptBuffers(
  config: GptConfig,
  sizes: TinyGptRunSizes,
): { gpu: PlannedBuffer[]; host: PlannedBuffer[] } {
  const { vocab: v, context: t, dim: c, heads: h, layers } = config;
  const grow = (flag: string, value: number, power = 1): Growth => ({ flag, value, power });
  const f32 = (what: string, shape: number[], grows: Growth[]): PlannedBuffer => ({
    what: `${what} f32 [${shape.join(", ")}]`,
    bytes: 4 * shape.reduce((a, b) => a * b, 1),
    grows,
  });
  const gpu: PlannedBuffer[] = [
    f32("fc1's weight", [c, 4 * c], [grow("dim", c, 2)]),
    f32("the position table", [t, c], [grow("context", t), grow("dim", c)]),
  ];
  for (const [flag, b] of [["batch", sizes.batch], ["samples", sizes.samples]] as const) {
    const rows = [grow(flag, b), grow("context", t)];
    gpu.push(
      f32(`the MLP's hidden rows (--${flag} ${b})`, [b * t, 4 * c], [...rows, grow("dim", c)]),
      f32(`the attention's q, k, v (--${flag} ${b})`, [b * t, 3 * c], [...rows, grow("dim", c)]),
      f32(`the logits (--${flag} ${b})`, [b * t, v], rows),
    );
    if (config.fusedAttention === false) {
      gpu.push(f32(`the attention scores (--${flag} ${b})`, [b * h, t, t], [
        grow(flag, b),
        grow("context", t, 2),
      ]));
    }
  }
  const parameters = layers * (12 * c * c + 13 * c) + (v + t) * c + 2 * c + c * v + v; // the most: untied, biases
  const host = [
    f32("the initial weights", [parameters], [grow("dim", c, 2), grow("layers", layers)]),
    f32("the validation windows", [2, sizes.evalWindows, t], [
      grow("eval-windows", sizes.evalWindows),
      grow("context", t),
    ]),
  ];
  return { gpu, host };
}
