/**
 * Gradient checkpointing for modules: a wrapper that checkpoints one module,
 * and `checkpointSequential`, which splits a sequence of layers into
 * segments (√n of them by default, or as many as a memory budget needs) and
 * checkpoints each, as PyTorch's `checkpoint_sequential` does.
 */
import {
  bytesPerElement,
  checkpoint,
  fail,
  noGrad,
  shortValue,
  type Tensor,
  tidy,
  ValueError,
} from "../gpu/mod.ts";
import { Module } from "./module.ts";

/**
 * How to split layers: a segment count, `"auto"` (≈ √n), or a budget for
 * activation memory (bytes beyond the parameters, their gradients and the
 * optimizer state).
 */
export type SegmentSpec = number | "auto" | { budgetBytes: number };

/** A split of layers into checkpointed segments, with the memory it is expected to need. */
export interface CheckpointPlan {
  /** Each segment's layers as [first, end) indices. */
  segments: [number, number][];
  /** Estimated activation bytes at the peak of a training step with this split. */
  estimatedPeakBytes: number;
  /** Estimated activation bytes without checkpointing. */
  plainPeakBytes: number;
  /** With a budget: whether the estimate fits it. */
  fits: boolean;
}

/** Wraps a module so its forward is checkpointed: its activations are recomputed in backward. */
export class Checkpointed extends Module {
  /** The wrapped module (its parameters appear under `inner.`). */
  readonly inner: Module;

  /** Checkpoints `inner`. */
  constructor(inner: Module) {
    super();
    this.inner = this.registerModule("inner", inner);
  }

  /** Runs `inner` without keeping its activations. */
  forward(x: Tensor): Tensor {
    return checkpoint((input) => this.inner.forward(input), x);
  }
}

const measured = new WeakMap<readonly Module[], Map<string, number[]>>();

/**
 * Bytes of each layer's output for an input like `input`, from one forward
 * run in eval mode without the tape (so no dropout draw and no BatchNorm
 * update happens), cached per layer list and input shape.
 */
export function activationBytes(layers: readonly Module[], input: Tensor): number[] {
  const key = `${input.describe()}`;
  let byShape = measured.get(layers);
  if (!byShape) measured.set(layers, byShape = new Map());
  const cached = byShape.get(key);
  if (cached) return cached;
  const modes = layers.map((layer) => layer.training);
  layers.forEach((layer) => layer.eval());
  try {
    const sizes = noGrad(() =>
      tidy(() => {
        const out: number[] = [];
        let h = input;
        for (const layer of layers) {
          h = layer.forward(h);
          out.push(h.size * bytesPerElement(h.dtype));
        }
        return out;
      })
    );
    byShape.set(key, sizes);
    return sizes;
  } finally {
    layers.forEach((layer, i) => layer.train(modes[i]));
  }
}

function balanced(sizes: readonly number[], count: number): [number, number][] {
  const total = sizes.reduce((a, b) => a + b, 0);
  const segments: [number, number][] = [];
  let start = 0, acc = 0;
  for (let i = 0; i < sizes.length; i++) {
    acc += sizes[i];
    const remainingSegments = count - segments.length - 1;
    const layersLeft = sizes.length - i - 1;
    if (
      remainingSegments > 0 &&
      (acc >= (total * (segments.length + 1)) / count || layersLeft === remainingSegments)
    ) {
      segments.push([start, i + 1]);
      start = i + 1;
    }
  }
  segments.push([start, sizes.length]);
  return segments;
}

/**
 * The estimate behind the plans: the inputs kept at segment boundaries, plus
 * the activations of the largest segment while it is recomputed, plus two
 * gradient buffers of the largest layer.
 */
function estimate(
  sizes: readonly number[],
  inputBytes: number,
  segments: [number, number][],
): number {
  const boundary = segments.reduce((sum, [a]) => sum + (a === 0 ? inputBytes : sizes[a - 1]), 0);
  const largest = Math.max(
    ...segments.map(([a, b]) => sizes.slice(a, b).reduce((x, y) => x + y, 0)),
  );
  return boundary + largest + 2 * Math.max(...sizes);
}

/**
 * Throws a ValueError from `where` unless `spec` is a {@link SegmentSpec}: a
 * positive integer, `"auto"` or `{ budgetBytes }` with budgetBytes > 0.
 */
export function checkSegmentSpec(where: string, spec: unknown): asserts spec is SegmentSpec {
  const budget =
    typeof spec === "object" && spec !== null && Object.keys(spec).join() === "budgetBytes"
      ? (spec as { budgetBytes: unknown }).budgetBytes
      : undefined;
  const ok = spec === "auto" || (typeof budget === "number" && budget > 0) ||
    (typeof spec === "number" && Number.isInteger(spec) && spec >= 1);
  if (ok) return;
  fail(
    ValueError,
    where,
    `${shortValue(spec)} is not a checkpoint spec; give a segment count (an integer >= 1), ` +
      '"auto" (about √n segments) or { budgetBytes } with budgetBytes > 0.',
  );
}

/**
 * Chooses segments for `layers` and `input`: a fixed count, about √n, or the
 * fewest segments whose estimated peak fits `budgetBytes` (the lowest
 * estimate when none fits; `fits` then says so). Runs the layers once
 * without the tape to measure their outputs.
 */
export function planCheckpointSegments(
  layers: readonly Module[],
  input: Tensor,
  spec: SegmentSpec,
): CheckpointPlan {
  const n = layers.length;
  if (n === 0) throw new ValueError("checkpointSequential: no layers given.");
  checkSegmentSpec("checkpointSequential", spec);
  const sizes = activationBytes(layers, input);
  const inputBytes = input.size * bytesPerElement(input.dtype);
  const plainPeakBytes = sizes.reduce((a, b) => a + b, inputBytes);
  const planFor = (count: number) => {
    const segments = balanced(sizes, Math.min(Math.max(1, Math.round(count)), n));
    return { segments, estimatedPeakBytes: estimate(sizes, inputBytes, segments), plainPeakBytes };
  };
  if (spec === "auto") return { ...planFor(Math.sqrt(n)), fits: true };
  if (typeof spec === "number") return { ...planFor(spec), fits: true };
  let best = planFor(1);
  for (let count = 1; count <= n; count++) {
    const plan = planFor(count);
    if (plan.estimatedPeakBytes <= spec.budgetBytes) return { ...plan, fits: true };
    if (plan.estimatedPeakBytes < best.estimatedPeakBytes) best = plan;
  }
  return { ...best, fits: false };
}

/** Runs `layers` on `input` with each segment of `plan` checkpointed. */
export function runCheckpointed(
  layers: readonly Module[],
  plan: CheckpointPlan,
  input: Tensor,
): Tensor {
  let h = input;
  for (const [a, b] of plan.segments) {
    const segment = layers.slice(a, b);
    h = checkpoint((x) => segment.reduce((acc, layer) => layer.forward(acc), x), h);
  }
  return h;
}

/**
 * Splits `layers` into segments as `segments` says and checkpoints each:
 * activation memory falls from n layers' worth to about 2√n with `"auto"`,
 * for one extra forward pass. Returns the output and the plan it used.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkpointSequential, initGpu, Linear, ReLU, Sequential, sum, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const layers = [new Linear(4, 4, { seed: 1 }), new ReLU(), new Linear(4, 4), new ReLU()];
 * const model = new Sequential(...layers);
 * const x = Tensor.from([1, 2, 3, 4, 4, 3, 2, 1], [2, 4]);
 * const { output, plan } = checkpointSequential(model.layers, "auto", x);
 * sum(output).backward(); // each segment runs again, then backpropagates
 * assert.equal(plan.segments.join(" "), "0,2 2,4"); // √4 = 2 segments of 2 layers
 * gpu.destroy();
 * ```
 */
export function checkpointSequential(
  layers: readonly Module[],
  segments: SegmentSpec,
  input: Tensor,
): { output: Tensor; plan: CheckpointPlan } {
  const plan = planCheckpointSegments(layers, input, segments);
  return { output: runCheckpointed(layers, plan, input), plan };
}
