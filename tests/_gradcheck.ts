/**
 * Finite-difference gradient check in f32: the directional derivative
 * (f(x + εv) − f(x − εv)) / 2ε along a random direction v must match ⟨∇f, v⟩
 * from backward(). One pair of forward passes checks every input at once.
 */
import assert from "node:assert/strict";
import { backward, noGrad, type Shape, Tensor, tidy } from "../gpu/mod.ts";
import { dot, uniform } from "./_reference.ts";

/** Checks the gradient of the scalar `f` at `points` (f32 inputs of `shapes`). */
export async function gradcheck(
  name: string,
  f: (inputs: Tensor[]) => Tensor,
  points: Float64Array[],
  shapes: Shape[],
  options: { eps?: number; rtol?: number; seed?: number } = {},
): Promise<void> {
  const eps = options.eps ?? 1e-2, rtol = options.rtol ?? 2e-2;
  const leaves = points.map((p, i) =>
    Tensor.from(Float32Array.from(p), shapes[i], { requiresGrad: true })
  );
  const loss = tidy(() => f(leaves));
  backward(loss);
  loss.dispose();
  let analytic = 0;
  const directions = points.map((p, i) => uniform(p.length, (options.seed ?? 7) + i));
  for (let i = 0; i < leaves.length; i++) {
    assert(leaves[i].grad, `${name}: input ${i} got no gradient`);
    analytic += dot(await leaves[i].grad!.read(), directions[i]);
  }
  const at = async (sign: number) => {
    const moved = points.map((p, i) =>
      Tensor.from(p.map((v, j) => v + sign * eps * directions[i][j]), shapes[i])
    );
    const value = await noGrad(() => tidy(() => f(moved))).item();
    moved.forEach((t) => t.dispose());
    return value;
  };
  const numeric = ((await at(1)) - (await at(-1))) / (2 * eps);
  leaves.forEach((t) => {
    t.grad?.dispose();
    t.dispose();
  });
  const err = Math.abs(analytic - numeric);
  assert(
    err <= rtol * Math.max(Math.abs(numeric), 1e-2),
    `${name}: analytic directional derivative ${analytic} vs finite difference ${numeric}`,
  );
}
