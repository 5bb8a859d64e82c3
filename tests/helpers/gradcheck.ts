/**
 * Finite-difference gradient checks in f32, of a function's inputs
 * ({@link gradcheck}) or of a module's parameters ({@link paramGradcheck}).
 *
 * - Directional, along several random directions v: the central difference
 *   (f(x + εv) − f(x − εv)) / 2ε must match ⟨∇f, v⟩ from backward(). One
 *   direction checks one linear combination of the gradient: an error
 *   orthogonal to it, or one that cancels against another, passes; three
 *   independent directions leave no such luck.
 * - Per element, for every input of at most `elementwiseMax` elements
 *   (biases, norm scales): along each unit vector. A small input's share of a
 *   random directional derivative over thousands of weights is below the
 *   tolerance, so a wrong bias gradient would pass the directional check.
 *
 * Tolerance: |analytic − numeric| ≤ rtol·max(|numeric|, 1e-2) + roundoff.
 * The central difference's truncation error is O(ε²·f''') ≈ 1e-4 relative at
 * ε = 1e-2 for smooth f, and each f32 evaluation of f is off by up to ~64
 * ulps of |f| (sums of a few hundred terms: u = 6e-8), which the difference
 * divides by 2ε: roundoff = 64·u·(|f₊| + |f₋|) / 2ε. rtol = 2% leaves room for
 * kinks (relu, max) within ε of a point; a wrong gradient term (a sign, a
 * missing factor, a dropped bias) is off by O(100%).
 */
import assert from "node:assert/strict";
import { backward, noGrad, type Shape, Tensor, tidy } from "../../gpu/mod.ts";
import type { Module } from "../../nn/mod.ts";
import { dot, uniform } from "./reference.ts";

/** Options of both checks. */
export interface GradcheckOptions {
  /** Step (default 1e-2). */
  eps?: number;
  /** Relative tolerance (default 2e-2; see the module comment). */
  rtol?: number;
  /** Seed of the random directions. */
  seed?: number;
  /** Random directions (default 3). */
  directions?: number;
  /** Inputs of at most this many elements are also checked element by element (default 16). */
  elementwiseMax?: number;
}

/** f32 unit roundoff, and the ulps of |f| one evaluation may be off by. */
const F32_ROUNDOFF = 2 ** -24, EVALUATION_ULPS = 64;

/**
 * The shared check: `grads` (from backward) at `base` against central
 * differences of `value`, which evaluates f at moved points.
 */
async function compare(
  name: string,
  grads: ArrayLike<number>[],
  base: ArrayLike<number>[],
  value: (points: Float64Array[]) => Promise<number>,
  labels: string[],
  options: GradcheckOptions,
): Promise<void> {
  const eps = options.eps ?? 1e-2, rtol = options.rtol ?? 2e-2;
  const check = async (what: string, direction: (i: number) => ArrayLike<number> | null) => {
    const moved = (sign: number) =>
      base.map((b, i) => {
        const v = direction(i);
        return Float64Array.from(b, (x, j) => x + (v === null ? 0 : sign * eps * v[j]));
      });
    const plus = await value(moved(1)), minus = await value(moved(-1));
    const numeric = (plus - minus) / (2 * eps);
    let analytic = 0;
    grads.forEach((g, i) => {
      const v = direction(i);
      if (v !== null) analytic += dot(g, v);
    });
    const roundoff = EVALUATION_ULPS * F32_ROUNDOFF * (Math.abs(plus) + Math.abs(minus)) /
      (2 * eps);
    const err = Math.abs(analytic - numeric);
    assert(
      err <= rtol * Math.max(Math.abs(numeric), 1e-2) + roundoff,
      `${name}: ${what}: analytic derivative ${analytic} vs finite difference ${numeric}`,
    );
  };
  const seed = options.seed ?? 7;
  for (let d = 0; d < (options.directions ?? 3); d++) {
    const directions = base.map((b, i) => uniform(b.length, seed + i + 1000 * d));
    await check(`random direction ${d}`, (i) => directions[i]);
  }
  const max = options.elementwiseMax ?? 16;
  for (const [i, b] of base.entries()) {
    if (b.length > max) continue;
    for (let e = 0; e < b.length; e++) {
      const unit = new Float64Array(b.length);
      unit[e] = 1;
      await check(`${labels[i]}[${e}]`, (k) => (k === i ? unit : null));
    }
  }
}

/** Checks the gradient of the scalar `f` at `points` (f32 inputs of `shapes`). */
export async function gradcheck(
  name: string,
  f: (inputs: Tensor[]) => Tensor,
  points: Float64Array[],
  shapes: Shape[],
  options: GradcheckOptions = {},
): Promise<void> {
  const leaves = points.map((p, i) =>
    Tensor.from(Float32Array.from(p), shapes[i], { requiresGrad: true })
  );
  const loss = tidy(() => f(leaves));
  backward(loss);
  loss.dispose();
  const grads: (Float32Array | Int32Array)[] = [];
  for (const [i, leaf] of leaves.entries()) {
    assert(leaf.grad, `${name}: input ${i} got no gradient`);
    grads.push(await leaf.grad.read());
    leaf.grad.dispose();
    leaf.dispose();
  }
  // The base point in f32, as the leaves held it.
  const base = points.map((p) => Float32Array.from(p));
  await compare(
    name,
    grads,
    base,
    async (moved) => {
      const inputs = moved.map((p, i) => Tensor.from(p, shapes[i]));
      const value = await noGrad(() => tidy(() => f(inputs))).item();
      inputs.forEach((t) => t.dispose());
      return value;
    },
    points.map((_, i) => `input ${i}`),
    options,
  );
}

/**
 * Checks the gradients of `module`'s parameters of the scalar `f()` (which
 * runs the module), then restores the parameters and zeroes their gradients.
 */
export async function paramGradcheck(
  name: string,
  module: Module,
  f: () => Tensor,
  options: GradcheckOptions = {},
): Promise<void> {
  const named = module.namedParameters(), params = named.map(([, p]) => p);
  const loss = tidy(f);
  loss.backward();
  loss.dispose();
  const grads = await Promise.all(params.map((p) => p.grad!.read()));
  const base = await Promise.all(params.map((p) => p.read()));
  const write = (values: ArrayLike<number>[]) =>
    params.forEach((p, i) => p.writeBytes(new Uint8Array(Float32Array.from(values[i]).buffer)));
  try {
    await compare(
      name,
      grads,
      base,
      async (moved) => {
        write(moved);
        return await noGrad(() => tidy(f)).item();
      },
      named.map(([n]) => n),
      options,
    );
  } finally {
    write(base);
    module.zeroGrad();
  }
}
