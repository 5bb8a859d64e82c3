/**
 * The autograd tape. Each primitive op records one node with one backward
 * rule; `backward()` walks the nodes in reverse topological order, adds up
 * the gradients flowing into every tensor, and accumulates (+=) into the
 * `.grad` of leaf tensors. Activations a rule needs are saved as shared
 * handles (`Tensor.share`) and released as soon as the rule has run, so
 * memory falls during the backward pass.
 */
import { DTypeError, fail, ShapeError, StateError } from "../base/errors.ts";
import { launchAccumulateInto, launchCopy, launchUnary } from "../kernels/elementwise.ts";
import { launchFill } from "../kernels/fill.ts";
import type { OpObserver } from "./runtime_state.ts";
import type { OpName } from "../base/op_registry.ts";
import { releaseCasts } from "./autocast_hook.ts";
import { runtime, withState } from "./runtime_state.ts";
import { type BackwardOptions, gradDtypeOf, type GradNode, Tensor } from "./tensor.ts";
import { untracked } from "./scope.ts";
import { sameShape } from "../base/shape.ts";

/**
 * Given the gradient of the node's output, the gradients of its inputs (null:
 * none). `needs[i]` tells whether input i wants one, so a rule can skip work
 * (e.g. the input gradient of a first layer).
 */
export type BackwardRule = (
  gradOutput: Tensor,
  saved: readonly Tensor[],
  needs: readonly boolean[],
) => (Tensor | null)[];

/**
 * One recorded op. A node is held by its output tensor and by every node that
 * consumes that output; when the last holder lets go (the output and its
 * consumers were disposed without a backward pass), the saved activations
 * are freed, so an abandoned graph does not leak GPU memory.
 */
export class TapeNode implements GradNode {
  #saved: Tensor[] | null;
  #holders = 1;
  /** A node for `op`; {@link record} makes these. */
  constructor(
    /** The op's registry name, for errors. */
    readonly op: OpName,
    /** The op's inputs, in the order the rule returns their gradients. */
    readonly inputs: readonly Tensor[],
    /** The output this node produced. */
    readonly output: Tensor,
    /** The gradient rule. */
    readonly rule: BackwardRule,
    saved: Tensor[],
  ) {
    this.#saved = saved;
  }

  /** Runs the rule once and releases the saved activations. */
  apply(gradOutput: Tensor): (Tensor | null)[] {
    const saved = this.#saved;
    if (saved === null) {
      fail(
        StateError,
        "backward",
        `the saved activations of '${this.op}' were freed, by an earlier backward() ` +
          "or because every tensor of the graph was disposed. Run the forward pass again.",
      );
    }
    try {
      return this.rule(gradOutput, saved, this.inputs.map((t) => t.requiresGrad));
    } finally {
      this.release();
    }
  }

  /**
   * Backpropagates from `output`, the tensor this node produced (what
   * `Tensor.backward` calls; see {@link backward}).
   */
  backpropagate(output: Tensor, options: BackwardOptions): void {
    const given = options.gradient;
    if (given && (given.dtype !== output.dtype || !sameShape(given.shape, output.shape))) {
      fail(
        given.dtype !== output.dtype ? DTypeError : ShapeError,
        "backward",
        `gradient ${given.describe()} must match output ${output.describe()}.`,
      );
    }
    if (!given && output.size !== 1) {
      fail(
        ShapeError,
        "backward",
        `output ${output.describe()} is not a single value; pass options.gradient ` +
          "or reduce it first (e.g. with mean()).",
      );
    }
    // The seed of ones is filled on the GPU: an upload would split the step in two submits.
    const seed = given ??
      untracked(() => Tensor.adopt(launchFill(output.shape, 1, output.dtype, output.gpu)));
    try {
      runBackward(this, seed);
    } finally {
      if (!given) seed.dispose();
    }
  }

  /** Frees the saved activations (after backward, or when the graph is abandoned). */
  release(): void {
    for (const t of this.#saved ?? []) t.dispose();
    this.#saved = null;
  }

  /** One more holder (a consumer node). @internal */
  hold(): void {
    this.#holders++;
  }

  /**
   * One holder fewer; at none, frees the saved activations and lets go of the
   * nodes this one consumed (iteratively: graphs can be thousands deep).
   */
  drop(): void {
    const stack: TapeNode[] = [this];
    while (stack.length > 0) {
      const node = stack.pop()!;
      if (--node.#holders > 0) continue;
      node.release();
      // Every node a tensor holds was made by record(): a TapeNode.
      for (const input of node.inputs) if (input.gradFn) stack.push(input.gradFn as TapeNode);
    }
  }
}

/** True unless inside {@link noGrad}. */
export function isGradEnabled(): boolean {
  return runtime.gradEnabled;
}

/**
 * Runs `fn` without recording anything on the tape (evaluation, optimizer
 * updates). Ops inside produce tensors with `requiresGrad` false.
 */
export function noGrad<T>(fn: () => T): T {
  return withState({ gradEnabled: false }, fn);
}

/** Runs `fn` with recording on, even inside `noGrad`. */
export function enableGrad<T>(fn: () => T): T {
  return withState({ gradEnabled: true }, fn);
}

/** What {@link record} puts on the tape (the shape of TensorFlow.js's `GradConfig`). */
export interface RecordSpec {
  /** The op's registry name. */
  op: OpName;
  /** The op's tensor inputs, in the order `backward` returns their gradients. */
  inputs: readonly Tensor[];
  /** The tensor the op produced; it becomes the node's output. */
  output: Tensor;
  /** Tensors the rule needs later, kept alive by shared handles (default none). */
  save?: readonly Tensor[];
  /** The gradient rule. */
  backward: BackwardRule;
  /**
   * Record whenever grad mode is on, even when no input requires grad (a
   * checkpointed region may hold parameters that do). Default false.
   */
  always?: boolean;
}

/**
 * Records an op on the tape when grad mode is on and any input needs a
 * gradient (or `always`), and returns its output. The saved tensors are held
 * by shared handles until the rule has run or the graph is dropped.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, record, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const x = Tensor.from([1, 2], [2], { requiresGrad: true });
 * const y = x.share(); // an op's output (here: the identity, as a view)
 * record({ op: "reshape", inputs: [x], output: y, backward: (g) => [g.share()] });
 * y.backward({ gradient: Tensor.from([3, 4], [2]) });
 * assert.equal((await x.grad!.read()).join(), "3,4");
 * gpu.destroy();
 * ```
 */
export function record(spec: RecordSpec): Tensor {
  const { op, inputs, output } = spec;
  let node: TapeNode | null = null;
  if (runtime.gradEnabled && (spec.always || inputs.some((t) => t.requiresGrad))) {
    const saved = untracked(() => (spec.save ?? []).map((t) => t.share()));
    output.requiresGrad = true;
    output.gradFn = node = new TapeNode(op, inputs, output, spec.backward, saved);
    for (const input of inputs) input.gradFn?.hold();
  }
  if (runtime.opObserver !== null) runtime.opObserver.forward(op, inputs, output, node);
  // Casts autocast made for this op go now: the node keeps what it saved.
  return releaseCasts(inputs, output);
}

/** Nodes reachable from `root`, ordered so each node comes after every node that uses its output. */
function reverseTopologicalOrder(root: TapeNode): TapeNode[] {
  const order: TapeNode[] = [];
  const seen = new Set<TapeNode>();
  // Iterative post-order DFS: deep models would overflow a recursive one.
  const stack: [TapeNode, number][] = [[root, 0]];
  seen.add(root);
  while (stack.length > 0) {
    const top = stack[stack.length - 1];
    const [node, i] = top;
    if (i < node.inputs.length) {
      top[1]++;
      const child = node.inputs[i].gradFn as TapeNode | null;
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
 * Computes the gradient of `output` with respect to every leaf tensor that
 * has `requiresGrad`, accumulating (+=) into their `.grad`. Records nothing on
 * the tape, and frees the graph's saved activations as it goes: a second
 * backward through the same graph is an error. Does not wait for the GPU.
 * The same as `output.backward(options)`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { backward, initGpu, mean, mul, square, sub, Tensor } from "../../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const w = Tensor.from([1, 1], [2], { requiresGrad: true });
 * const x = Tensor.from([1, 2], [2]), y = Tensor.zeros([2]);
 * const loss = mean(square(sub(mul(w, x), y)));
 * backward(loss); // or loss.backward()
 * assert.equal((await w.grad!.read()).join(), "1,4"); // (w·x − y) · x
 * gpu.destroy();
 * ```
 */
export function backward(output: Tensor, options: BackwardOptions = {}): void {
  output.backward(options);
}

/** The backward pass proper from `root`'s output; `gradOutput` stays owned by the caller. */
function runBackward(root: TapeNode, gradOutput: Tensor): void {
  const pending = new Map<Tensor, Tensor>([[root.output, gradOutput]]);
  // The observer sees the gradients, not the ops rules run to make them; a
  // checkpoint's nested pass (run by a rule) reports to the enclosing pass's.
  const observer = runtime.opObserver ?? backwardObserver;
  const enclosing = backwardObserver;
  backwardObserver = observer;
  try {
    runRules(root, gradOutput, pending, observer);
  } finally {
    backwardObserver = enclosing;
  }
  for (const g of pending.values()) if (g !== gradOutput) g.dispose();
}

/** The observer of the backward pass running now, if any. */
let backwardObserver: OpObserver | null = null;

/** runBackward's loop: every node's rule, in reverse topological order. */
function runRules(
  root: TapeNode,
  gradOutput: Tensor,
  pending: Map<Tensor, Tensor>,
  observer: OpObserver | null,
): void {
  withState({ tracking: false, gradEnabled: false, opObserver: null }, () => {
    for (const node of reverseTopologicalOrder(root)) {
      const grad = pending.get(node.output);
      pending.delete(node.output);
      if (!grad) {
        node.release();
        continue;
      }
      const inputGrads = node.apply(grad);
      const given: Tensor[] = []; // every gradient handed to a destination
      const consumed: Tensor[] = []; // added into an existing one: freed after the loop
      let moved = false; // `grad` itself became an input's gradient
      node.inputs.forEach((input, i) => {
        let g = inputGrads[i];
        if (!g || !input.requiresGrad) return;
        checkGradient(node.op, input, g);
        if (observer !== null) observer.backward(node, i, g);
        // A rule may pass its incoming gradient straight through (add, reshape,
        // the cast of a working copy), or return one buffer for several inputs.
        // Every destination must own its buffer, since gradients are
        // accumulated in place: the first one that reaches the incoming
        // gradient takes it over (it is ours, and about to be freed), later
        // ones and the caller's gradient are copied.
        const taken = given.some((t) => t.sharesMemoryWith(g!));
        if (taken || (grad === gradOutput && g.sharesMemoryWith(grad))) {
          g = Tensor.adopt(launchCopy(g));
        }
        given.push(g);
        const target = input.gradFn ? pending.get(input) : input.grad;
        if (target) {
          launchAccumulateInto(target, g); // reads g in f32, adds in f32, rounds once to target's dtype
          consumed.push(g);
          return;
        }
        if (!input.gradFn && g.dtype !== gradDtypeOf(input)) {
          // A leaf that keeps a narrower gradient (an fp32 master under apex O2) got one in
          // its own dtype (a bias, LayerNorm's γ/β, the embedding table): narrowed once here.
          consumed.push(g);
          g = Tensor.adopt(launchUnary("identity", g, { out: gradDtypeOf(input) }));
        }
        if (g === grad) moved = true;
        if (input.gradFn) pending.set(input, g);
        else input.grad = g;
      });
      for (const g of consumed) if (g !== grad) g.dispose();
      for (const g of inputGrads) if (g && g !== grad && !given.includes(g)) g.dispose();
      if (grad !== gradOutput && !moved) grad.dispose();
    }
  });
}

function checkGradient(op: OpName, input: Tensor, grad: Tensor): void {
  // A leaf with a gradDtype takes its gradient in that dtype or in its own (then narrowed).
  const dtypeOk = grad.dtype === input.dtype ||
    (!input.gradFn && grad.dtype === gradDtypeOf(input));
  if (!dtypeOk || !sameShape(grad.shape, input.shape)) {
    fail(
      !dtypeOk ? DTypeError : ShapeError,
      "backward",
      `the rule of '${op}' returned a gradient ${grad.describe()} for an input ` +
        `${input.describe()}; gradients must match their input's shape and dtype` +
        `${input.gradDtype ? ` (or its gradDtype ${input.gradDtype})` : ""}.`,
    );
  }
}

/**
 * Frees the `.grad` of every tensor in `tensors` and sets it to null (what
 * `Module.zeroGrad` and every optimizer's `zeroGrad` do).
 */
export function zeroGrad(tensors: Iterable<Tensor>): void {
  for (const t of tensors) {
    t.grad?.dispose();
    t.grad = null;
  }
}
