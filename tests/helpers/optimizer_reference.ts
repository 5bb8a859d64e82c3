/**
 * f64 reference optimizers (torch.optim.SGD / Adam / AdamW, written from
 * their documentation, never from our WGSL) and the drivers the optimizer
 * tests share.
 */
import assert from "node:assert/strict";
import { Tensor } from "../../gpu/mod.ts";
import type { Adam, AdamOptions, SGD, SGDOptions, WorkingCopies } from "../../optim/mod.ts";
import { gpu } from "./gpu.ts";
import { assertClose, TOL } from "./assert.ts";
import { quantize, uniform } from "./reference.ts";

export type Opt = SGD | Adam;
export type GradDType = "f32" | "f16" | "bf16";

// 1 element, a few, and one that is no multiple of the 1024-element workgroup span.
export const SIZES = [1, 7, 1031];

/** An f64 reference optimizer for one parameter; `lr` may be changed between steps. */
export interface Ref {
  p: Float64Array;
  lr: number;
  step(g: ArrayLike<number>): void;
}

/** torch.optim.SGD, dampening 0, from its documentation. */
export function sgdRef(p0: ArrayLike<number>, o: SGDOptions): Ref {
  const p = Float64Array.from(p0), v = new Float64Array(p.length);
  const { momentum: m = 0, nesterov = false, weightDecay: wd = 0 } = o;
  return {
    p,
    lr: o.lr,
    step(g) {
      for (let i = 0; i < p.length; i++) {
        let d = g[i] + wd * p[i];
        if (m > 0) {
          v[i] = m * v[i] + d; // v starts at 0: the first v is d, as PyTorch's clone
          d = nesterov ? d + m * v[i] : v[i];
        }
        p[i] -= this.lr * d;
      }
    },
  };
}

/** torch.optim.Adam / AdamW (apex FusedAdam's bias_correction switch), from their documentation. */
export function adamRef(p0: ArrayLike<number>, o: AdamOptions): Ref & { t: number } {
  const p = Float64Array.from(p0), m = new Float64Array(p.length), v = new Float64Array(p.length);
  const { betas: [b1, b2] = [0.9, 0.999], eps = 1e-8, weightDecay: wd = 0 } = o;
  return {
    p,
    t: 0,
    lr: o.lr ?? 1e-3,
    step(g) {
      const t = ++this.t, lr = this.lr;
      const bc1 = (o.biasCorrection ?? true) ? 1 - b1 ** t : 1;
      const bc2 = (o.biasCorrection ?? true) ? 1 - b2 ** t : 1;
      for (let i = 0; i < p.length; i++) {
        let gi = g[i];
        if (o.decoupledWeightDecay) p[i] *= 1 - lr * wd;
        else gi += wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        p[i] -= (lr / bc1) * m[i] / (Math.sqrt(v[i]) / Math.sqrt(bc2) + eps);
      }
    },
  };
}

/** Working copies held in a plain map (amp's MasterWeights is the real owner). */
export class CopyMap extends Map<Tensor, Tensor> implements WorkingCopies {
  /** The masters that have a copy. */
  get masters(): Tensor[] {
    return [...this.keys()];
  }
  /** The copy of `master`. */
  copyOf(master: Tensor): Tensor | undefined {
    return this.get(master);
  }
}

/**
 * Parameters of every size (f32 values in [-1, 1)) with working copies in
 * `copyDtype`: bf16 ones always, f16 ones when the adapter has f16.
 */
export function setup(seed: number, copyDtype: "f16" | "bf16" = "f16") {
  const init = SIZES.map((n, k) => quantize(uniform(n, seed + k), "f32"));
  const params = init.map((v) => Tensor.from(v, [v.length]));
  const copies = new CopyMap();
  if (gpu.f16 || copyDtype === "bf16") {
    params.forEach((p, k) => copies.set(p, Tensor.from(init[k], p.shape, { dtype: copyDtype })));
  }
  return { init, params, copies };
}

/** Changing gradients: step s of parameter k, as the GPU stores them in `dtype`. */
export function gradFor(s: number, k: number, n: number, dtype: GradDType): Float64Array {
  return quantize(uniform(n, 7919 * (s + 1) + k, -2, 2), dtype);
}

export function setGrads(params: Tensor[], s: number, dtype: GradDType): Float64Array[] {
  return params.map((p, k) => {
    const g = gradFor(s, k, p.size, dtype);
    p.grad?.dispose();
    p.grad = Tensor.from(g, p.shape, { dtype });
    return g;
  });
}

/** Masters against the references, and each working copy equal to its master rounded to its dtype. */
export async function check(
  what: string,
  params: Tensor[],
  copies: CopyMap,
  refs: Ref[],
) {
  const masters = await Promise.all(params.map((p) => p.read()));
  masters.forEach((m, k) => assertClose(m, refs[k].p, TOL.f32, `${what}, param ${k}`));
  for (const [k, p] of params.entries()) {
    const copy = copies.get(p);
    if (copy) {
      const want = Float32Array.from(quantize(masters[k], copy.dtype as GradDType));
      assert.deepStrictEqual(await copy.read(), want, `${what}, copy ${k}`);
    }
  }
}

/** Runs `steps` steps of `make` against `refOf`, checking after each one. */
export async function matchesReference(
  what: string,
  make: (params: Tensor[]) => Opt,
  refOf: (p0: Float64Array, k: number) => Ref,
  dtype: GradDType,
  options: { steps?: number; gradScale?: number; groupOf?: (k: number) => number } = {},
): Promise<void> {
  // bf16 gradients come with bf16 working copies (an AMP bf16 run), the others with f16 ones.
  const { init, params, copies } = setup(11, dtype === "bf16" ? "bf16" : "f16");
  const opt = make(params);
  opt.setWorkingCopies(copies);
  const refs = init.map(refOf);
  const scale = options.gradScale;
  const gradScale = scale === undefined ? undefined : Tensor.from([scale], [1]);
  for (let s = 0; s < (options.steps ?? 6); s++) {
    const grads = setGrads(params, s, dtype);
    opt.step({ gradScale });
    refs.forEach((r, k) => r.step(grads[k].map((g) => g * (scale ?? 1))));
    await check(`${what} (${dtype} grads), step ${s}`, params, copies, refs);
  }
  opt.dispose();
}

/** Everything a skipped step must leave alone, as plain data. */
export async function snapshot(opt: Opt, params: Tensor[], copies: CopyMap) {
  return {
    state: await opt.stateDict(),
    masters: await Promise.all(params.map((p) => p.read())),
    copies: await Promise.all([...copies.values()].map((c) => c.read())),
  };
}
