/**
 * The autograd tape. Each primitive op records one node with one backward
 * rule; `backward()` walks the nodes in reverse topological order, adds up
 * the gradients flowing into every tensor, and accumulates (+=) into the
 * `.grad` of leaf tensors. Activations a rule needs are saved as shared
 * handles (`Tensor.share`) and released as soon as the rule has run, so
 * memory falls during the backward pass.
 */
import { GpuError } from "./device.ts";
import { Tensor } from "./tensor.ts";
import { untracked } from "./scope.ts";
import { sameShape } from "./shape.ts";

/** Given the gradient of the node's output, the gradients of its inputs (null: none). */
export type BackwardRule = (gradOutput: Tensor, saved: readonly Tensor[]) => (Tensor | null)[];

/** One recorded op. */
export class GradNode {
  #saved: Tensor[] | null;
  constructor(
    /** The op's name, for errors. */
    readonly op: string,
    /** The op's inputs, in the order the rule returns their gradients. */
    readonly inputs: readonly Tensor[],
    /** The output this node produced. */
    readonly output: Tensor,
    readonly rule: BackwardRule,
    saved: Tensor[],
  ) {
    this.#saved = saved;
  }

  /** Runs the rule once and releases the saved activations. */
  apply(gradOutput: Tensor): (Tensor | null)[] {
    const saved = this.#saved;
    if (saved === null) {
      throw new GpuError(
        `backward: the graph through '${this.op}' was already used by an earlier backward() ` +
          "and its saved activations are freed. Run the forward pass again.",
      );
    }
    try {
      return this.rule(gradOutput, saved);
    } finally {
      this.release();
    }
  }

  /** Frees the saved activations (after backward, or when the graph is abandoned). */
  release(): void {
    for (const t of this.#saved ?? []) t.dispose();
    this.#saved = null;
  }
}

let gradEnabled = true;

/** True unless inside {@link noGrad}. */
export function isGradEnabled(): boolean {
  return gradEnabled;
}

/**
 * Runs `fn` without recording anything on the tape (evaluation, optimizer
 * updates). Ops inside produce tensors with `requiresGrad` false.
 */
export function noGrad<T>(fn: () => T): T {
  const before = gradEnabled;
  gradEnabled = false;
  try {
    return fn();
  } finally {
    gradEnabled = before;
  }
}

/**
 * Records `op` on the tape when any input needs a gradient. `save` lists the
 * tensors the rule needs later; they are kept alive by shared handles.
 */
export function record(
  op: string,
  inputs: readonly Tensor[],
  output: Tensor,
  rule: BackwardRule,
  save: readonly Tensor[] = [],
): Tensor {
  if (gradEnabled && inputs.some((t) => t.requiresGrad)) {
    const saved = untracked(() => save.map((t) => t.share()));
    output.requiresGrad = true;
    output.gradFn = new GradNode(op, inputs, output, rule, saved);
  }
  return output;
}

/** Nodes reachable from `root`, ordered so each node comes after every node that uses its output. */
function reverseTopologicalOrder(root: GradNode): GradNode[] {
  const order: GradNode[] = [];
  const seen = new Set<GradNode>();
  // Iterative post-order DFS: deep models would overflow a recursive one.
  const stack: [GradNode, number][] = [[root, 0]];
  seen.add(root);
  while (stack.length > 0) {
    const top = stack[stack.length - 1];
    const [node, i] = top;
    if (i < node.inputs.length) {
      top[1]++;
      const child = node.inputs[i].gradFn;
      if (child && !seen.has(child)) {
        seen.add(child);
        stack.push([child, 0]);
      }
    } else {
      stack.pop();
      order.push(node);
    }
  }
  return order.reverse();
}

/**
 * Computes gradients of `output` with respect to every leaf tensor with
 * `requiresGrad`, accumulating (+=) into their `.grad`. `output` must hold a
 * single value unless `gradOutput` (same shape and dtype) is given.
 * Records nothing on the tape. Frees the graph's saved activations.
 *
 * @param accumulate adds `src` into `dst` in place (the elementwise kernel; injected to keep layers apart)
 */
export function runBackward(
  output: Tensor,
  gradOutput: Tensor,
  accumulate: (dst: Tensor, src: Tensor) => void,
  copy: (t: Tensor) => Tensor,
): void {
  if (!output.gradFn) {
    throw new GpuError(
      `backward: tensor ${output.describe()} does not require grad; ` +
        "none of the inputs it was computed from has requiresGrad set.",
    );
  }
  const pending = new Map<Tensor, Tensor>([[output, gradOutput]]);
  untracked(() =>
    noGrad(() => {
      for (const node of reverseTopologicalOrder(output.gradFn!)) {
        const grad = pending.get(node.output);
        pending.delete(node.output);
        if (!grad) {
          node.release();
          continue;
        }
        const inputGrads = node.apply(grad);
        const given = new Set<Tensor>();
        node.inputs.forEach((input, i) => {
          let g = inputGrads[i];
          if (!g || !input.requiresGrad) return;
          checkGradient(node.op, input, g);
          // A rule may pass its incoming gradient straight through, or return one
          // tensor for several inputs; every destination must own its buffer.
          if (g === grad || given.has(g)) g = copy(g);
          given.add(g);
          const target = input.gradFn ? pending.get(input) : input.grad;
          if (target) {
            accumulate(target, g);
            g.dispose();
          } else if (input.gradFn) {
            pending.set(input, g);
          } else {
            input.grad = g;
          }
        });
        for (const g of inputGrads) if (g && g !== grad && !given.has(g)) g.dispose();
        if (grad !== gradOutput) grad.dispose();
      }
    })
  );
  for (const g of pending.values()) if (g !== gradOutput) g.dispose();
}

function checkGradient(op: string, input: Tensor, grad: Tensor): void {
  if (grad.dtype !== input.dtype || !sameShape(grad.shape, input.shape)) {
    throw new GpuError(
      `backward: the rule of '${op}' returned a gradient ${grad.describe()} for an input ` +
        `${input.describe()}; gradients must match their input's shape and dtype.`,
    );
  }
}
